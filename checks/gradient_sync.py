"""gradient-sync: after every optimizer step the replicas hold identical parameters."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.analysis.api import Check, CheckResult, Finding, Location
from ddpdoctor.analysis.compare import relative_difference
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts import Divergence
from ddpdoctor.schema.events import Step
from ddpdoctor.schema.sampling import describe

from ._common import fmt_ranks

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


def _param_name(evidence: Evidence, rank: int, opt: int, index: int) -> tuple[str, bool, Optional[int]]:
    info = evidence.facts.optimizer_info(rank, opt)
    if info is not None and index < len(info.names):
        ddp_of = info.ddp_of[index] if index < len(info.ddp_of) else None
        return info.names[index], bool(info.in_ddp[index]), ddp_of
    return f"param{index}", False, None


def _optimizer_site(evidence: Evidence, rank: int, opt: int) -> Optional[Location]:
    info = evidence.facts.optimizer_info(rank, opt)
    return Location.from_site(info.site) if info else None


def _grad_case(evidence: Evidence, div: Divergence, in_ddp: bool, ddp_index: Optional[int]) -> tuple[str, str, str]:
    """(case id, explanation, fix) for gradients that differ across ranks."""
    facts = evidence.facts
    if not facts.ddp_wraps:
        return ("not-wrapped", "the model is not wrapped in DistributedDataParallel, so gradients are never averaged",
                "Wrap the model: `model = DistributedDataParallel(model)` after init_process_group, and train through it.")
    if not in_ddp:
        return ("outside-ddp", "this parameter is not part of any DDP-wrapped module, so its gradient is never averaged",
                "Put every trained module inside the model you wrap with DistributedDataParallel.")
    key = str(ddp_index)
    windows = [e.forwards[key] for e in div.events.values() if key in e.forwards]
    synced = sum(w.get("synced", 0) for w in windows)
    unsynced = sum(w.get("unsynced", 0) for w in windows)
    inner = sum(w.get("inner", 0) for w in windows)
    if synced == 0 and unsynced > 0:
        return ("step-in-no-sync", "the optimizer stepped after backward passes run inside `no_sync()`; no all-reduce happened",
                "Inside `no_sync()` only accumulate; run the last micro-batch's forward/backward outside it, then step.")
    if inner > synced + unsynced:
        return ("ddp-bypassed", "the forward pass called the wrapped module directly (`model.module(...)`), bypassing DDP's gradient hooks",
                "Call the DDP wrapper itself: `output = model(inputs)`, not `model.module(inputs)`.")
    wraps = facts.ddp_wraps.get(ddp_index, {})
    tolerant = any(w.find_unused_parameters or w.static_graph for w in wraps.values())
    unused = any(u.unused for u in facts.ddp_usage.get(ddp_index, {}).values())
    if unused and not tolerant:
        return ("reduction-incomplete", "some parameters got no gradient, so DDP's bucketed all-reduce never completed (see unused-parameters)",
                "Make every parameter take part in the loss, or pass find_unused_parameters=True.")
    return ("modified-after-backward", "DDP synchronized the backward pass, but the gradients were changed afterwards on some ranks",
            "Modify gradients (clipping, scaling, masking) identically on every rank, after backward and before step.")


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    if not evidence.any(Step):
        return CheckResult(summary="no optimizer step observed", applicable=False)
    div, num_compared = evidence.facts.divergence
    if num_compared == 0:
        return CheckResult(summary="no optimizer step was seen on two ranks", applicable=False)
    every = evidence.facts.fingerprint_every
    sampled = "" if every == 1 else f" (fingerprinted {describe(every)})"
    if div is None:
        return CheckResult(summary=f"replicas identical after {num_compared} compared steps{sampled}")
    rank0 = div.groups[0][0]
    name, in_ddp, ddp_index = _param_name(evidence, rank0, div.optimizer, div.index)
    odd = [r for g in div.groups[1:] for r in g]
    ranks = sorted(r for g in div.groups for r in g)
    diffs = [d for d in (relative_difference(div.values[rank0], div.values[r]) for r in odd) if d is not None]
    diff = max(diffs) if diffs else None  # word sums say the bits differ, not by how much
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
        case, why, fix = _grad_case(evidence, div, in_ddp, ddp_index)
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
