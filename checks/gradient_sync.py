"""gradient-sync: after every optimizer step the replicas hold identical parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, Location, evidence_field
from ddpdoctor.analysis.compare import group_by_value, relative_difference
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.steps import Divergence
from ddpdoctor.analysis.symptoms import Divergence as Case
from ddpdoctor.analysis.symptoms import BuffersDiffer, NotDistributed, ReplicasDiverged
from ddpdoctor.schema.findings import ABSENT
from ddpdoctor.schema.events import (CommHook, Collective, DDPBypass, DDPRewrap, DeviceSimulation,
                                     InitProcessGroup, ModuleConversion, ShardedWrap, Step, Unfrozen)
from ddpdoctor.schema.fingerprints import decode_fingerprints
from ddpdoctor.schema.sampling import describe

from ._common import fmt_ranks, short_site

ID = "gradient-sync"

DOCS = """\
## What it does
Fingerprints every parameter's gradient just before each optimizer step and every parameter just
after it, on every rank, and compares them across ranks. It names the first step and parameter that
differ, the ranks, the size of the difference, and which case it is:

- **gradients differ**: DDP did not average them. The model is not wrapped in
  DistributedDataParallel, the forward pass called `model.module(...)` and bypassed DDP's hooks
  (the finding points at that forward), DDP was constructed again around the same module and the
  forward alternates between a wrapper and the bare module, the optimizer stepped inside
  `no_sync()`, a parameter lives outside the DDP module, a parameter was frozen
  (`requires_grad=False`) when DDP was built and unfrozen later (DDP's reducer only takes what
  requires grad at construction: both lines are named), or the wrapped model was converted or
  moved after wrapping (`.to(dtype)`, `.half()`, `.float()`, `.cpu()`, `.cuda()`: its parameters
  get new storage while DDP's hooks and buckets keep the old tensors).
- **gradients differ as they come out of DDP's all-reduce**: nothing changed them between the
  end of the backward pass and the step; the registered communication hook, or the interconnect,
  returned different results on some ranks.
- **gradients changed after the all-reduce**: user code (clipping, scaling, masking) modified them
  on some ranks only.
- **gradients equal, parameters differ**: something changed the weights outside the optimizer on
  some ranks (in-place edits on one rank, rank-dependent learning rate or weight decay, a checkpoint
  loaded on rank 0 only after wrapping).

Whether gradients already differed out of DDP's all-reduce or were changed after it comes from a
sampled snapshot of the gradients at the end of the all-reduce, taken on the default schedule's
steps. With `--fingerprint-every`, which fingerprints more steps, a divergence can start at a step
without one: the cause is then the one seen at the next step with a snapshot, when the same
gradient still differs there, and the finding names that step.

Under the CUDA simulation of a CPU-only machine, moving the wrapped model to the CPU and back
changes nothing, so the gradients still agree there; the round trip itself is reported as the
GPU bug it is, when the model trains through the same wrapper after it (a model moved off the GPU
once training ended and back for testing, as Lightning does between `fit` and `test`, is fine).

A sharded model without DDP is compared by shard. Under HSDP (`fully_shard` on a 2-D replicate x
shard mesh, FSDP1's `HYBRID_SHARD`) the ranks along the replicate dimension hold the same shard, and
after every step they must hold the same values of it: the finding names the first step and
parameter whose shard differs between them (**shard-replicas-differ**). Apart from the first step
they most likely started apart: `fully_shard` broadcasts nothing (DDP does), so a model built after
`torch.manual_seed(seed + rank)`, or loaded on some ranks only, keeps each rank's own values, and
HSDP applies the same averaged gradient to different weights forever. Under pure FSDP (a 1-D mesh)
every shard exists once: there is no replica to compare, and the summary says so.

Local SGD is not a fault: where the optimizer steps without DDP's gradient all-reduce (inside
`no_sync()`) and the script all-reduces the parameters every few steps (Accelerate's LocalSGD,
torch's PeriodicModelAverager, by hand), the replicas differ between averagings by design, and
the finding is an info naming the averaging line and its period.

## Why it matters
DDP is only data parallelism if every replica stays identical. Once they drift, each rank trains
its own model on its own shard: the job trains worse on 8 GPUs than on 1, and the checkpoint rank 0
writes is one of N different models.

## Example
```python
model = DDP(net)
for x, y in loader:
    loss = loss_fn(model.module(x), y)   # bypasses DDP: no gradient all-reduce
    loss.backward()
    optimizer.step()
```

## Use instead
```python
    loss = loss_fn(model(x), y)          # call the DDP wrapper itself
```
Wrap the model with `DistributedDataParallel` before training, step the optimizer only after a
synchronized backward (outside `no_sync()`), and change weights only through the optimizer or
identically on every rank.
"""


@dataclass(frozen=True)
class Diverged(EvidenceRecord, ReplicasDiverged):
    """The first step and parameter at which the replicas differ; ``case`` (symptoms.Divergence) says why."""

    case: str = evidence_field(hidden=True, default="")
    step: Optional[int] = evidence_field(label="optimizer step", keep_none=True)
    optimizer: int = evidence_field(hidden=True, default=0)
    parameter: str = evidence_field(label="parameter", unit="code", default="")
    compared: str = evidence_field(label="compared", unit="grads-or-params", default="grads")
    rank_groups: list[list[int]] = evidence_field(hidden=True, default_factory=list)
    fingerprints: dict[str, Any] = evidence_field(hidden=True, default_factory=dict)
    relative_difference: Optional[float] = evidence_field(label="relative difference", unit="fraction", keep_none=True)
    # Sampled steps: the replicas diverged after this step (None: at the first compared step).
    last_identical_step: Optional[int] = evidence_field(keep_none=True)
    # The later step whose all-reduce snapshot shows the cause (None: ``step`` itself). --fingerprint-every
    # takes the snapshot on the automatic schedule's steps only (sampling.explains).
    cause_step: Optional[int] = evidence_field(label="cause seen at optimizer step")


@dataclass(frozen=True)
class ConvertedAfterWrap(Diverged):
    """The wrapped model converted or moved after wrapping: each call, where, after which step."""

    discriminator = {"case": Case.CONVERTED_AFTER_WRAP.value}
    # [{call, at, after_step}]
    conversions: list[dict[str, Any]] = evidence_field(default_factory=list, units={"call": "code"})


@dataclass(frozen=True)
class Rewrapped(Diverged):
    """DDP built again around a module it wraps: both wraps, and the bare module's forward."""

    discriminator = {"case": Case.DDP_REWRAPPED.value}
    first_wrap: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    wrapped_again: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    bare_forward: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)


@dataclass(frozen=True)
class ChangedAfterBackward(Diverged):
    """Gradients changed after DDP's all-reduce: by which ranks, where that is known."""

    discriminator = {"case": Case.MODIFIED_AFTER_BACKWARD.value}
    changed_after_all_reduce: dict[str, Any] = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class FrozenAtWrap(Diverged):
    """A parameter frozen when DDP was built and made trainable later."""

    discriminator = {"case": Case.FROZEN_AT_WRAP.value}
    wrapped_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    unfrozen_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    unfrozen_by: Optional[str] = evidence_field(keep_none=True)


@dataclass(frozen=True)
class CommHookDiffers(Diverged):
    """The registered communication hook returned different results on some ranks."""

    discriminator = {"case": Case.COMM_HOOK.value}
    comm_hook: dict[str, Any] = evidence_field(default_factory=dict)  # {name, module, at}


@dataclass(frozen=True)
class AllReduceDiffers(Diverged):
    """DDP's all-reduce itself returned different results, with no hook and no change after it."""

    discriminator = {"case": Case.ALL_REDUCE_DIFFERS.value}
    backend: str = evidence_field(default="")


@dataclass(frozen=True)
class PeriodicAveraging(Diverged):
    """Local SGD: the replicas train apart and the script averages the parameters back, by design."""

    discriminator = {"case": Case.PERIODIC_AVERAGING.value}
    averaged_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    averaged_after_steps: list[int] = evidence_field(default_factory=list)


@dataclass(frozen=True)
class DeviceRoundTrip(EvidenceRecord, ReplicasDiverged):
    """The wrapped model moved off the GPU and back: the replicas diverge on a GPU, not under the simulation."""

    discriminator = {"case": Case.DEVICE_ROUND_TRIP.value}
    case: str = evidence_field(hidden=True, default=Case.DEVICE_ROUND_TRIP.value)
    # [{call, at, after_step}]
    moves: list[dict[str, Any]] = evidence_field(default_factory=list, units={"call": "code"})


def _not_wrapped(finding: Finding) -> bool:
    return (finding.severity in ("error", "warning") and isinstance(finding.evidence, Diverged)
            and finding.evidence.case == Case.NOT_WRAPPED)


def _not_distributed(symptom: Finding, _cause: Finding) -> bool:
    return isinstance(symptom.evidence, NotDistributed)


def _skips_ddp_sync(finding: Finding) -> bool:
    """A forward that bypasses DDP, or a step inside no_sync: DDP's synchronization was skipped."""
    return (finding.severity in ("error", "warning") and isinstance(finding.evidence, Diverged)
            and finding.evidence.case in (Case.DDP_BYPASSED, Case.STEP_IN_NO_SYNC))


def _unbroadcast_buffers(symptom: Finding, _cause: Finding) -> bool:
    """Buffers that differ although DDP broadcasts them: the skipped forward skipped the broadcast too."""
    return isinstance(symptom.evidence, BuffersDiffer) and symptom.evidence.broadcast_buffers is True


EXPLAINS = (
    # A model never wrapped in DDP: the gradients that differ say it, not-distributed repeats it.
    Explains("not wrapped in DDP", _not_distributed, cause=_not_wrapped, priority=50),
    # A forward that bypasses DDP, or a step inside no_sync, also skips DDP's buffer broadcast.
    Explains("buffers not broadcast", _unbroadcast_buffers, cause=_skips_ddp_sync, priority=60),
)


def _param_name(evidence: Evidence, rank: int, opt: int, index: int, n: Optional[int] = None
                ) -> tuple[str, bool, Optional[int], Optional[int]]:
    """(name, inside a DDP module, that module's index, the DDP module that holds it frozen since its
    construction) of an optimizer's parameter."""
    info = facts.steps.optimizer_info(evidence, rank, opt, n)
    if info is not None and index < len(info.names):
        ddp_of = info.ddp_of[index] if index < len(info.ddp_of) else None
        frozen_in = info.frozen_in[index] if index < len(info.frozen_in) else None
        return info.names[index], bool(info.in_ddp[index]), ddp_of, frozen_in
    return f"param{index}", False, None, None


def _optimizer_site(evidence: Evidence, rank: int, opt: int) -> Optional[Location]:
    info = facts.steps.optimizer_info(evidence, rank, opt)
    return Location.from_site(info.site) if info else None


@dataclass
class _Case:
    case: str
    why: str
    fix: str
    location: Optional[Location] = None
    extra: dict = field(default_factory=dict)  # the fields of `record` beyond Diverged's
    record: type[Diverged] = Diverged


CONVERSION_FIX = ("Convert or move the model before wrapping it in DistributedDataParallel, never the wrapped model: "
                  "evaluate in lower precision under `torch.autocast` (or on a separate copy of the module), and to "
                  "change devices build a new DDP around the moved module.")


def _call(event: ModuleConversion) -> str:
    return f"`{_method(event)}` at {short_site(Location.from_site(event.site))}"


def _method(event: ModuleConversion) -> str:
    return f".{event.method}({event.target if event.method in ('to', 'type') else ''})"


def _at(site) -> Optional[dict]:
    location = Location.from_site(site)
    return location.to_json() if location else None


def _conversions(evidence: Evidence, ranks, before: dict[int, int]) -> list[ModuleConversion]:
    """Conversions that gave a DDP module's parameters new storage, before each rank's step."""
    found: dict[tuple, ModuleConversion] = {}
    for rank in ranks:
        for event in evidence.ranks[rank].of(ModuleConversion):
            if event.swapped and event.step < before.get(rank, 1 << 62):
                found.setdefault((event.method, Location.from_site(event.site)), event)
    return sorted(found.values(), key=lambda e: e.t)


def _first_site(evidence: Evidence, kind: type, ranks, **fields) -> tuple[Optional[Location], Optional[object]]:
    events = [e for r in ranks for e in evidence.ranks[r].of(kind)
              if all(getattr(e, k) == v for k, v in fields.items())]
    events.sort(key=lambda e: e.t)
    return (Location.from_site(events[0].site), events[0]) if events else (None, None)


def _wrap_site(evidence: Evidence, ddp: Optional[int]) -> Optional[Location]:
    wraps = facts.ddp.wraps(evidence).get(ddp if ddp is not None else 0, {})
    return Location.from_site(next(iter(wraps.values())).site) if wraps else None


def _reduced(div: Divergence) -> Optional[dict[int, list]]:
    """Each rank's fingerprint of the divergent gradient as DDP's all-reduce left it, when every
    rank knows it: Step.reduced (sampled, on every rank alike), or in older evidence the
    gradients before the step where none changed since."""
    out = {}
    sampled = any(step.reduced is not None and not step.touched for step in div.events.values())
    for rank, step in div.events.items():
        if step.touched is None:
            return None
        if step.reduced is None and (step.touched or sampled):
            return None  # not comparable with the other ranks' values
        encoded = step.reduced if step.reduced is not None else step.grads
        values = decode_fingerprints(encoded or "")
        if div.index >= len(values):
            return None
        value = values[div.index]
        out[rank] = None if value is None else [value[0]]
    return out


def _grad_case(evidence: Evidence, div: Divergence, in_ddp: bool, ddp_index: Optional[int]) -> _Case:
    """The case of gradients that differ across ranks, with its explanation and fix."""
    ranks = sorted(div.events)
    if not facts.ddp.wraps(evidence):
        return _Case(Case.NOT_WRAPPED,
                     "the model is not wrapped in DistributedDataParallel, so gradients are never averaged",
                     "Wrap the model: `model = DistributedDataParallel(model)` after init_process_group, and train "
                     "through it.")
    conversions = _conversions(evidence, ranks, {r: e.step for r, e in div.events.items()})
    if conversions:
        calls = " and ".join(_call(c) for c in conversions[:3])
        return _Case(Case.CONVERTED_AFTER_WRAP,
                     f"the wrapped model was converted after DDP wrapped it ({calls}): its parameters got new storage, "
                     f"while DDP's gradient hooks and buckets still point at the old tensors, so the gradients are no "
                     f"longer averaged", CONVERSION_FIX, Location.from_site(conversions[0].site),
                     {"conversions": [{"call": _method(c), "at": _at(c.site), "after_step": c.step}
                                      for c in conversions]}, ConvertedAfterWrap)
    bypass_at, bypass = _first_site(evidence, DDPBypass, ranks)
    rewraps = [e for r in ranks for e in evidence.ranks[r].of(DDPRewrap)]
    if rewraps and (bypass is not None or not in_ddp):
        first = rewraps[0]
        wraps = facts.ddp.wraps(evidence)
        first_at = _wrap_site(evidence, first.previous)
        again_at = (Location.from_site(next(iter(wraps.get(first.ddp, {}).values())).site) if wraps.get(first.ddp)
                    else None)
        wrappers = 1 + len({e.ddp for e in rewraps if e.rank == first.rank})
        where = (f"at {short_site(first_at)}" if first_at == again_at
                 else f"first at {short_site(first_at)}, again at {short_site(again_at)}")
        why = (f"DistributedDataParallel is constructed again around a module DDP already wraps ({wrappers} wrappers "
               f"around it, {where})")
        if bypass is not None:
            why += (f", and the forward alternates between a DDP wrapper and the bare module (at "
                    f"{short_site(bypass_at)}): the bare module's forwards skip DDP's gradient all-reduce")
        return _Case(Case.DDP_REWRAPPED, why,
                     "Wrap the model once, before training, and call that wrapper for every training forward: "
                     "`model = DistributedDataParallel(net)` outside the loop, then `model(x)`.",
                     bypass_at or again_at, {"first_wrap": first_at.to_json() if first_at else None,
                                             "wrapped_again": again_at.to_json() if again_at else None,
                                             "bare_forward": bypass_at.to_json() if bypass_at else None}, Rewrapped)
    if not in_ddp:
        return _Case(Case.OUTSIDE_DDP,
                     "this parameter is not part of any DDP-wrapped module, so its gradient is never averaged",
                     "Put every trained module inside the model you wrap with DistributedDataParallel.")
    key = str(ddp_index)
    windows = [e.forwards[key] for e in div.events.values() if key in e.forwards]
    synced = sum(w.get("synced", 0) for w in windows)
    unsynced = sum(w.get("unsynced", 0) for w in windows)
    inner = sum(w.get("inner", 0) for w in windows)
    if synced == 0 and unsynced > 0:
        return _Case(Case.STEP_IN_NO_SYNC,
                     "the optimizer stepped after backward passes run inside `no_sync()`; no all-reduce happened",
                     "Inside `no_sync()` only accumulate; run the last micro-batch's forward/backward outside it, "
                     "then step.")
    if inner > synced + unsynced:
        canonical = facts.ddp.canonical(evidence).get(ddp_index, ddp_index)
        location, _ = _first_site(evidence, DDPBypass, ranks, ddp=canonical)
        return _Case(Case.DDP_BYPASSED,
                     "the forward pass called the wrapped module directly (`model.module(...)`), bypassing DDP's "
                     "gradient hooks",
                     "Call the DDP wrapper itself: `output = model(inputs)`, not `model.module(inputs)`.",
                     location or bypass_at)
    wraps = facts.ddp.wraps(evidence).get(ddp_index, {})
    tolerant = any(w.find_unused_parameters or w.static_graph for w in wraps.values())
    unused = any(u.unused for u in facts.ddp.usage(evidence).get(ddp_index, {}).values())
    if unused and not tolerant:
        return _Case(Case.REDUCTION_INCOMPLETE,
                     "some parameters got no gradient, so DDP's bucketed all-reduce never completed (see "
                     "unused-parameters)",
                     "Make every parameter take part in the loss, or pass find_unused_parameters=True.")
    cause = _explained(evidence, div)
    reduced = _reduced(cause)
    if reduced is not None and len(group_by_value(reduced)) > 1:
        return _seen_at(_allreduce_case(evidence, ranks, ddp_index), div, cause)
    touched = sorted(r for r, e in cause.events.items() if e.touched)
    why = "DDP synchronized the backward pass, but the gradients were changed afterwards on some ranks"
    extra = {}
    if reduced is not None and touched:
        why += f" ({fmt_ranks(touched)} changed gradients between the end of DDP's all-reduce and the step)"
        extra = {"changed_after_all_reduce": {str(r): cause.events[r].touched for r in touched}}
    return _seen_at(_Case(Case.MODIFIED_AFTER_BACKWARD, why,
                          "Modify gradients (clipping, scaling, masking) identically on every rank, after backward "
                          "and before step.",
                          extra=extra, record=ChangedAfterBackward), div, cause)


def _explained(evidence: Evidence, div: Divergence) -> Divergence:
    """``div``, or where its step has no all-reduce snapshot on some rank (a step that
    ``--fingerprint-every`` added between the automatic schedule's: sampling.explains), the next step
    that has one on the same ranks, if the same gradient still differs there: gradients that differ
    are a fault of their own step (DDP's all-reduce makes them equal whatever the weights), and one
    that goes on to the next explained step is most likely the same fault, seen there."""
    if all(e.touched is not None for e in div.events.values()):
        return div
    for (n, opt), per_rank in facts.steps.sampled(evidence).steps.items():
        if opt != div.optimizer or n <= div.step:
            continue
        events = {r: per_rank[r] for r in div.events if r in per_rank}
        if len(events) < len(div.events) or any(e.touched is None or e.grads is None for e in events.values()):
            continue
        decoded = {r: decode_fingerprints(e.grads or "") for r, e in events.items()}
        if any(div.index >= len(values) for values in decoded.values()):
            return div
        values = {r: d[div.index] for r, d in decoded.items()}
        groups = group_by_value(values)
        if len(groups) < 2:
            return div  # equal there: a fault of some steps only, whose cause was not seen
        return Divergence(n, opt, div.index, "grads", groups, values, events, div.last_identical_step)
    return div


def _seen_at(found: _Case, div: Divergence, cause: Divergence) -> _Case:
    """``found``, saying so where its cause was seen at a later step than the divergence."""
    if cause.step == div.step:
        return found
    return dataclasses.replace(found, why=f"{found.why} (seen at optimizer step {cause.step}, the first step after "
                                          f"{div.step} with DDP's all-reduce snapshot: under --fingerprint-every it "
                                          f"is taken on the default schedule's steps)",
                               extra={**found.extra, "cause_step": cause.step})


def _frozen_case(evidence: Evidence, div: Divergence, ddp_index: int) -> _Case:
    """A parameter of a wrapped module that was frozen when DDP was built and trains now: DDP's
    reducer only took the parameters that required grad at construction."""
    ranks = sorted(div.events)
    wrap_at = _wrap_site(evidence, ddp_index)
    unfreezes = sorted((e for r in ranks for e in evidence.ranks[r].of(Unfrozen) if e.ddp == ddp_index),
                       key=lambda e: e.t)
    unfrozen_at = Location.from_site(unfreezes[0].site) if unfreezes else None
    how = (f" and made trainable later (`{unfreezes[0].call}` at {short_site(unfrozen_at)})" if unfreezes
           else " and made trainable later")
    why = (f"it was frozen (requires_grad=False) when DistributedDataParallel was built "
           f"(at {short_site(wrap_at)}){how}: "
           f"DDP's reducer only takes the parameters that require grad at construction, so this one's gradients are "
           f"never averaged across ranks")
    fix = ("Freeze after wrapping: build DDP over the whole model with `find_unused_parameters=True` (frozen "
           "parameters get no gradient), then set requires_grad=False on what must not train yet; or build a new "
           "DistributedDataParallel after unfreezing.")
    return _Case(Case.FROZEN_AT_WRAP, why, fix, unfrozen_at or wrap_at,
                 {"wrapped_at": wrap_at.to_json() if wrap_at else None,
                  "unfrozen_at": unfrozen_at.to_json() if unfrozen_at else None,
                  "unfrozen_by": unfreezes[0].call if unfreezes else None}, FrozenAtWrap)


def _allreduce_case(evidence: Evidence, ranks: list[int], ddp_index: Optional[int]) -> _Case:
    hooks = [e for r in ranks for e in evidence.ranks[r].of(CommHook) if e.ddp in (ddp_index, None)]
    if hooks:
        hook = hooks[0]
        location = Location.from_site(hook.site)
        return _Case(Case.COMM_HOOK,
                     f"the gradients already differ as they come out of DDP's all-reduce: the communication hook "
                     f"`{hook.name}` (registered at {short_site(location)}) returned different results on some ranks, "
                     f"and nothing changed the gradients between the end of the backward pass and the step",
                     "Make the communication hook return the same reduced tensor on every rank: no rank-dependent "
                     "branches, randomness or in-place edits after the all-reduce. Run once without "
                     "`register_comm_hook` to confirm it is the hook.",
                     location, {"comm_hook": {"name": hook.name, "module": hook.module, "at": _at(hook.site)}},
                     CommHookDiffers)
    backend = next((e.backend for _, e in evidence.events(InitProcessGroup) if e.backend), "the backend")
    return _Case(Case.ALL_REDUCE_DIFFERS,
                 f"the gradients already differ as they come out of DDP's all-reduce, with no communication hook and "
                 f"no code changing them before the step: the collective itself returned different results on some "
                 f"ranks, which points at the interconnect or the communication library ({backend})",
                 "Test the interconnect: run the reference job (`ddpdoctor check` with no script) on the same nodes "
                 "with the same NCCL_* settings, compare with other nodes, and look for GPU or network errors (dmesg, "
                 "nvidia-smi -q, the NIC counters).",
                 _wrap_site(evidence, ddp_index), {"backend": backend}, AllReduceDiffers)


# Divergences a periodic averaging of the parameters explains: local steps inside no_sync (or with no
# gradient all-reduce at all), then an all-reduce of the parameters brings the replicas back together.
LOCAL_STEPS = (Case.STEP_IN_NO_SYNC, Case.NOT_WRAPPED, Case.PARAMS_MODIFIED)


def _parameter_averaging(evidence: Evidence, ranks: list[int], ddp_index: Optional[int], first_step: int
                         ) -> Optional[tuple[Optional[Location], list[int]]]:
    """(where, after which steps) the script all-reduced the model's parameters at or after the
    divergent step on every rank: per-parameter all-reduces covering every parameter shape of the DDP
    model, or one flattened all-reduce of all of them (torch's PeriodicModelAverager, Accelerate's
    LocalSGD). None when no rank did."""
    wraps = facts.ddp.wraps(evidence).get(ddp_index if ddp_index is not None else 0, {})
    wrap = next(iter(wraps.values()), None)
    if wrap is None or not wrap.shapes:
        return None
    shapes = sorted(tuple(s) for s in wrap.shapes)
    total = sum(_numel(s) for s in shapes)
    found: Optional[tuple[Optional[Location], list[int]]] = None
    for rank in ranks:
        windows: dict[int, list] = {}
        for call in evidence.ranks[rank].of(Collective):
            if call.op == "all_reduce" and call.step >= first_step - 1 and call.tensors:
                windows.setdefault(call.step, []).append(call)
        steps, site = [], None
        for step, calls in sorted(windows.items()):
            reduced = sorted(tuple(t[0]) for c in calls for t in c.tensors if t and isinstance(t[0], list))
            if _covers(reduced, shapes) or any(_numel(s) == total for s in reduced):
                steps.append(step)
                site = site or Location.from_site(calls[0].site)
        if not steps:
            return None
        found = found or (site, steps)
    return found


def _numel(shape: tuple) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total


def _covers(reduced: list[tuple], shapes: list[tuple]) -> bool:
    """Every parameter shape (with its multiplicity) is among the all-reduced tensors' shapes."""
    pool = list(reduced)
    for shape in shapes:
        if shape not in pool:
            return False
        pool.remove(shape)
    return True


def _period(steps: list[int]) -> str:
    gaps = sorted({b - a for a, b in zip(steps, steps[1:])})
    if len(gaps) == 1:
        return f"{gaps[0]} optimizer steps"
    return "few optimizer steps" if gaps else "so often"


def _round_trip(evidence: Evidence) -> Optional[Finding]:
    """A wrapped model moved to the CPU and back under the CUDA simulation, where it changes nothing."""
    simulated = any(e.active for _, e in evidence.events(DeviceSimulation))
    if not simulated:
        return None
    ranks: list[int] = []
    pair = None
    for rank in sorted(evidence.ranks):
        moves = sorted((e for e in evidence.ranks[rank].of(ModuleConversion) if e.device_move and not e.swapped),
                       key=lambda e: e.t)
        steps = list(evidence.ranks[rank].of(Step))
        for off in (e for e in moves if "cpu" in e.target):
            back = next((e for e in moves if e.t >= off.t and "cpu" not in e.target), None)
            # Only training through the same wrapper after the move back breaks DDP: a model moved off the
            # GPU when training ended and back for testing (Lightning's fit, then test) never trains again.
            if back is not None and any(s.t > back.t and str(back.ddp) in s.forwards for s in steps):
                ranks.append(rank)
                pair = pair or (off, back)
                break
    if pair is None:
        return None
    off, back = pair
    message = (f"the DDP-wrapped model is moved off the GPU and back after wrapping "
               f"({_call(off)}, then {_call(back)}): "
               f"on a GPU that gives every parameter new storage while DDP's gradient hooks and buckets keep the old "
               f"tensors, so the gradients stop being averaged and the replicas drift apart. The CUDA simulation of "
               f"this CPU-only run makes both moves no-ops, which is why the gradients still agree here")
    return Finding(check=ID, severity="error", message=message, fix=CONVERSION_FIX, ranks=tuple(ranks),
                   location=Location.from_site(off.site),
                   evidence=DeviceRoundTrip(moves=[{"call": _method(e), "at": _at(e.site), "after_step": e.step}
                                                   for e in pair]))


SHARD_FIX = ("Build the model identically on every rank before `fully_shard` (the same seed, or the same "
             "checkpoint loaded on every rank: unlike DDP, fully_shard broadcasts nothing, each rank keeps its own "
             "slice of what it built); seed per-rank randomness (noise, dropout) only after the model is built; "
             "give every rank the same optimizer settings, and change weights and gradients only identically on "
             "every rank.")


def _sharding_site(evidence: Evidence, rank: int) -> Optional[Location]:
    """Where ``rank`` first sharded the model (its first fully_shard or FSDP1 call)."""
    for event in evidence.ranks[rank].of(ShardedWrap):
        return Location.from_site(event.site)
    return None


def _sharded(evidence: Evidence, sharding: facts.ddp.Sharding) -> CheckResult:
    """A sharded model without DDP: under HSDP the ranks that hold the same shard (the replicate
    dimension's peers) must hold the same values; under pure FSDP no rank has a replica to compare."""
    described = sharding.describe()
    if not sharding.hybrid:
        return CheckResult(summary=f"the model is sharded with {described}: each rank holds the only copy of its "
                                   f"shard, so there is no replica to compare", applicable=False)
    groups = facts.ddp.replicate_groups(evidence)
    if groups is None or all(len(g) < 2 for g in groups):
        return CheckResult(summary=f"the model is sharded with {described}: which ranks hold the same shard was not "
                                   f"recorded, so the replicas were not compared", applicable=False)
    if not evidence.any(Step):
        return CheckResult(summary="no optimizer step observed", applicable=False)
    div, num_compared = facts.steps.divergence_within(evidence, groups)
    sizes = "/".join(sorted({str(len(g)) for g in groups}))
    layout = f"{len(groups)} group{'s' if len(groups) != 1 else ''} of {sizes}"
    if num_compared == 0:
        return CheckResult(summary=f"no optimizer step was seen on two ranks holding the same shard ({layout})",
                           applicable=False)
    every = facts.steps.fingerprint_every(evidence)
    sampled = "" if every == 1 else f" (fingerprinted {describe(every)})"
    if div is None:
        return CheckResult(summary=f"shards identical across the replicate dimension ({layout}) after "
                                   f"{num_compared} compared steps{sampled}")
    rank0 = div.groups[0][0]
    name, _, _, _ = _param_name(evidence, rank0, div.optimizer, div.index, div.step)
    odd = [r for g in div.groups[1:] for r in g]
    ranks = sorted(r for g in div.groups for r in g)
    diffs = [d for d in (relative_difference(div.values[rank0], div.values[r]) for r in odd) if d is not None]
    location = _optimizer_site(evidence, rank0, div.optimizer)
    if div.kind == "grads":
        what = (f"the gradient of `{name}` differs at optimizer step {div.step} between {fmt_ranks(ranks)}, which "
                f"hold the same shard of it: HSDP all-reduces each shard's gradient across the replicate dimension, "
                f"so code changed it after the backward pass on some ranks (clipping, scaling, masking), or a rank "
                f"stepped without a synchronized backward")
    elif div.last_identical_step is None:
        location = _sharding_site(evidence, rank0) or location
        what = (f"`{name}` differs between {fmt_ranks(ranks)}, which hold the same shard of it, already after the "
                f"first compared optimizer step ({div.step}), while their gradients agree: the replicas started "
                f"apart and apply the same averaged gradient to different weights, so they never agree again. "
                f"`fully_shard` broadcasts nothing (DDP does): a model built after a rank-dependent seed, or loaded "
                f"on some ranks only, keeps each rank's own values (else the optimizer is configured differently "
                f"on some ranks)")
    else:
        what = (f"`{name}` differs between {fmt_ranks(ranks)}, which hold the same shard of it, after optimizer step "
                f"{div.step} (identical after step {div.last_identical_step}), while their gradients agree: the "
                f"weights were changed outside the optimizer, or the optimizer is configured differently, on some "
                f"ranks")
    evidence_out = Diverged(case=Case.SHARD_REPLICAS_DIFFER, step=div.step, optimizer=div.optimizer, parameter=name,
                            compared=div.kind, rank_groups=div.groups,
                            fingerprints={str(r): v for r, v in sorted(div.values.items())},
                            relative_difference=max(diffs) if diffs else None,
                            last_identical_step=div.last_identical_step)
    finding = Finding(check=ID, severity="error", message=what, fix=SHARD_FIX, ranks=tuple(ranks), location=location,
                      evidence=evidence_out)
    return CheckResult(findings=[finding], summary=f"replicas of a shard diverge at step {div.step} "
                                                   f"({fmt_ranks(ranks)}){sampled}")


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    sharded = facts.ddp.sharded_without_ddp(evidence)
    if sharded is not None:
        return _sharded(evidence, sharded)
    if not evidence.any(Step):
        return CheckResult(summary="no optimizer step observed", applicable=False)
    div, num_compared = facts.steps.divergence(evidence)
    if num_compared == 0:
        return CheckResult(summary="no optimizer step was seen on two ranks", applicable=False)
    every = facts.steps.fingerprint_every(evidence)
    sampled = "" if every == 1 else f" (fingerprinted {describe(every)})"
    if div is None:
        round_trip = _round_trip(evidence)
        if round_trip is not None:
            return CheckResult(findings=[round_trip], summary="the wrapped model is moved off the GPU and back "
                                                              "(harmless only under the CUDA simulation)")
        return CheckResult(summary=f"replicas identical after {num_compared} compared steps{sampled}")
    rank0 = div.groups[0][0]
    name, in_ddp, ddp_index, frozen_in = _param_name(evidence, rank0, div.optimizer, div.index, div.step)
    odd = [r for g in div.groups[1:] for r in g]
    ranks = sorted(r for g in div.groups for r in g)
    diffs = [d for d in (relative_difference(div.values[rank0], div.values[r]) for r in odd) if d is not None]
    diff = max(diffs) if diffs else None  # word sums say the bits differ, not by how much
    common = dict(step=div.step, optimizer=div.optimizer, parameter=name, compared=div.kind, rank_groups=div.groups,
                  fingerprints={str(r): v for r, v in sorted(div.values.items())}, relative_difference=diff,
                  last_identical_step=div.last_identical_step)
    location = _optimizer_site(evidence, rank0, div.optimizer)
    if div.kind == "grads":
        found = _frozen_case(evidence, div, frozen_in) if frozen_in is not None else None
        found = found or _grad_case(evidence, div, in_ddp, ddp_index)
        case, fix = found.case, found.fix
        location = found.location or location
        evidence_out = found.record(case=case, **common, **found.extra)
        message = f"gradients of `{name}` differ across ranks at optimizer step {div.step}: {found.why}"
    else:
        case = Case.PARAMS_MODIFIED
        evidence_out = Diverged(case=case, **common)
        message = (f"gradients were identical but parameter `{name}` differs across ranks after optimizer step "
                   f"{div.step}: the weights were changed outside the optimizer, or the optimizer is configured "
                   "differently, on some ranks")
        fix = ("Change weights only through the optimizer, or identically on every rank; give every rank the same "
               "optimizer settings; load checkpoints on every rank before wrapping with DDP.")
    severity = "error"
    averaged = _parameter_averaging(evidence, ranks, ddp_index, div.step) if case in LOCAL_STEPS else None
    if averaged is not None:  # Local SGD: the replicas train apart and are averaged back, by design
        site, steps = averaged
        severity, case = "info", Case.PERIODIC_AVERAGING
        evidence_out = PeriodicAveraging(case=case, **common, averaged_at=site.to_json() if site else None,
                                         averaged_after_steps=steps[:8])
        first = "gradients" if div.kind == "grads" else "parameters"
        message = (f"the replicas train apart between parameter averagings by design: the optimizer steps without "
                   f"DDP's gradient all-reduce ({first} of `{name}` first differ at optimizer step {div.step}), and "
                   f"the script all-reduces the parameters every {_period(steps)} at {short_site(site)} (Local "
                   f"SGD); between averagings gradient-sync cannot compare the replicas")
        fix = ("Nothing to do if periodic averaging (Local SGD) is intended; to check the training itself, run once "
               "with DDP's gradient all-reduce in every step.")
    finding = Finding(check=ID, severity=severity, message=message, fix=fix, ranks=tuple(ranks), location=location,
                      evidence=evidence_out)
    if severity == "info":
        return CheckResult(findings=[finding], summary=f"replicas averaged every {_period(averaged[1])} by the script "
                                                       f"(Local SGD): not compared between averagings{sampled}")
    return CheckResult(findings=[finding], summary=f"replicas diverge at step {div.step} ({fmt_ranks(ranks)}){sampled}")


CHECK = Check(id=ID, title="gradients and parameters in sync", analyze=analyze, docs=DOCS, order=10,
              probes=('ddp', 'optimizer', 'wrapping', 'sharding'),
              evidence=(ConvertedAfterWrap, Rewrapped, ChangedAfterBackward, FrozenAtWrap, CommHookDiffers,
                        AllReduceDiffers, PeriodicAveraging, DeviceRoundTrip, Diverged), explains=EXPLAINS)
