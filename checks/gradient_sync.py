"""gradient-sync: after every optimizer step the replicas hold identical parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.check_api import Check, CheckResult, Finding, Location
from ddpdoctor.compare import relative_difference
from ddpdoctor.evidence import Evidence
from ddpdoctor.sampling import describe

from ._common import fmt_ranks, group_by_value

ID = "gradient-sync"

DOCS = """\
## What it does
Fingerprints every parameter's gradient just before each optimizer step and every parameter just
after it, on every rank, and compares them across ranks. It names the first step and parameter that
differ, the ranks, the size of the difference, and which case it is:

- **gradients differ**: DDP did not average them. The model is not wrapped in
  DistributedDataParallel, the forward pass called `model.module(...)` and bypassed DDP's hooks,
  the optimizer stepped inside `no_sync()`, or a parameter lives outside the DDP module.
- **gradients equal, parameters differ**: something changed the weights outside the optimizer on
  some ranks (in-place edits on one rank, rank-dependent learning rate or weight decay, a checkpoint
  loaded on rank 0 only after wrapping).

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


@dataclass
class _Divergence:
    step: int
    optimizer: int
    index: int
    kind: str  # "grads" or "params"
    groups: list[list[int]]
    values: dict[int, list]
    events: dict[int, dict]
    last_identical_step: Optional[int] = None


def first_divergence(evidence: Evidence) -> tuple[Optional[_Divergence], int]:
    """The first (step, parameter) whose fingerprints differ across ranks, and how many steps compared."""
    by_step: dict[tuple[int, int], dict[int, dict]] = {}
    for rank, event in evidence.events("step"):
        if event.get("grads") is not None:
            by_step.setdefault((event["n"], event["opt"]), {})[rank] = event
    num_compared = 0
    last_identical: dict[int, int] = {}
    for (n, opt), events in sorted(by_step.items()):
        if len(events) < 2:
            continue
        num_compared += 1
        for kind in ("grads", "params"):
            reference = events[min(events)][kind]
            if all(e[kind] == reference for e in events.values()):
                continue  # bit-identical replicas, the common case: no per-parameter comparison
            length = min(len(e[kind]) for e in events.values())
            for i in range(length):
                values = {r: e[kind][i] for r, e in events.items()}
                groups = group_by_value(values)
                if len(groups) > 1:
                    return _Divergence(n, opt, i, kind, groups, values, events, last_identical.get(opt)), num_compared
        last_identical[opt] = n
    return None, num_compared


def _param_name(evidence: Evidence, rank: int, opt: int, index: int) -> tuple[str, bool]:
    for event in evidence.ranks[rank].of("optimizer"):
        if event.get("opt") == opt and index < len(event.get("names", [])):
            return event["names"][index], bool(event["in_ddp"][index])
    return f"param{index}", False


def _optimizer_site(evidence: Evidence, rank: int, opt: int) -> Optional[Location]:
    for event in evidence.ranks[rank].of("optimizer"):
        if event.get("opt") == opt:
            return Location.from_site(event.get("site"))
    return None


def _grad_case(evidence: Evidence, div: _Divergence, in_ddp: bool) -> tuple[str, str, str]:
    """(case id, explanation, fix) for gradients that differ across ranks."""
    if not evidence.any("ddp_wrap"):
        return ("not-wrapped", "the model is not wrapped in DistributedDataParallel, so gradients are never averaged",
                "Wrap the model: `model = DistributedDataParallel(model)` after init_process_group, and train through it.")
    if not in_ddp:
        return ("outside-ddp", "this parameter is not part of any DDP-wrapped module, so its gradient is never averaged",
                "Put every trained module inside the model you wrap with DistributedDataParallel.")
    windows = [w for e in div.events.values() for w in (e.get("ddp") or {}).values()]
    synced = sum(w.get("synced", 0) for w in windows)
    unsynced = sum(w.get("unsynced", 0) for w in windows)
    inner = sum(w.get("inner", 0) for w in windows)
    unused = any(w.get("unused") for w in windows)
    if synced == 0 and unsynced > 0:
        return ("step-in-no-sync", "the optimizer stepped after backward passes run inside `no_sync()`; no all-reduce happened",
                "Inside `no_sync()` only accumulate; run the last micro-batch's forward/backward outside it, then step.")
    if inner > synced + unsynced:
        return ("ddp-bypassed", "the forward pass called the wrapped module directly (`model.module(...)`), bypassing DDP's gradient hooks",
                "Call the DDP wrapper itself: `output = model(inputs)`, not `model.module(inputs)`.")
    if unused and not any(e.get("find_unused_parameters") for _, e in evidence.events("ddp_wrap")):
        return ("reduction-incomplete", "some parameters got no gradient, so DDP's bucketed all-reduce never completed (see unused-parameters)",
                "Make every parameter take part in the loss, or pass find_unused_parameters=True.")
    return ("modified-after-backward", "DDP synchronized the backward pass, but the gradients were changed afterwards on some ranks",
            "Modify gradients (clipping, scaling, masking) identically on every rank, after backward and before step.")


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    if not evidence.any("step"):
        return CheckResult(summary="no optimizer step observed", applicable=False)
    div, num_compared = first_divergence(evidence)
    if num_compared == 0:
        return CheckResult(summary="no optimizer step was seen on two ranks", applicable=False)
    every = max((e.get("fingerprint_every") or 0 for _, e in evidence.events("process_start")), default=1)
    sampled = "" if every == 1 else f" (fingerprinted {describe(every)})"
    if div is None:
        return CheckResult(summary=f"replicas identical after {num_compared} compared steps{sampled}")
    rank0 = div.groups[0][0]
    name, in_ddp = _param_name(evidence, rank0, div.optimizer, div.index)
    odd = [r for g in div.groups[1:] for r in g]
    ranks = sorted(r for g in div.groups for r in g)
    diff = max(relative_difference(div.values[rank0], div.values[r]) for r in odd)
    evidence_out = {
        "step": div.step,
        "optimizer": div.optimizer,
        "parameter": name,
        "compared": div.kind,
        "rank_groups": div.groups,
        "fingerprints": {str(r): v for r, v in sorted(div.values.items())},
        "relative_difference": diff,
        # Sampled steps: the replicas diverged after this step (None: at the first compared step).
        "last_identical_step": div.last_identical_step,
    }
    if div.kind == "grads":
        case, why, fix = _grad_case(evidence, div, in_ddp)
        message = f"gradients of `{name}` differ across ranks at optimizer step {div.step}: {why}"
    else:
        case = "params-modified"
        message = (f"gradients were identical but parameter `{name}` differs across ranks after optimizer step {div.step}: "
                   "the weights were changed outside the optimizer, or the optimizer is configured differently, on some ranks")
        fix = ("Change weights only through the optimizer, or identically on every rank; give every rank the same "
               "optimizer settings; load checkpoints on every rank before wrapping with DDP.")
    evidence_out = {"case": case, **evidence_out}  # first: the terminal shows the leading fields
    finding = Finding(check=ID, severity="error", message=message, fix=fix, ranks=tuple(ranks),
                      location=_optimizer_site(evidence, rank0, div.optimizer), evidence=evidence_out)
    return CheckResult(findings=[finding], summary=f"replicas diverge at step {div.step} ({fmt_ranks(ranks)}){sampled}")


CHECK = Check(id=ID, title="gradients and parameters in sync", analyze=analyze, docs=DOCS)
