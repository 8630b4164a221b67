"""An example ddpdoctor plugin: counts every rank's optimizer steps with its own in-rank probe.

The probe (``install``, run in every rank) counts steps through torch's global optimizer step
post-hook and records the count in its own event kind when the script ends; the analyzer
(``analyze``, run by the supervisor) turns those counts into findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from ddpdoctor.plugin import (CHECK_API_VERSION, Check, CheckResult, Event, Evidence, Finding, Recorder,
                              register_event)

ID = "example-optimizer-count"


@register_event
@dataclass(kw_only=True, slots=True)
class OptimizerCount(Event):
    """Optimizer steps this process took, written when the script ends."""

    kind: ClassVar[str] = "example.optimizer_count"
    count: int = 0


def install(rec: Recorder) -> Callable[[], None]:
    """In-rank probe: count steps of every optimizer (imports torch, so only ranks load it)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    count = 0

    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal count
        count += 1

    handle = register_optimizer_step_post_hook(counted)

    def finish() -> None:
        handle.remove()
        rec.emit(OptimizerCount(count=count))

    return finish


def analyze(evidence: Evidence) -> CheckResult:
    counts = {rank: event.count for rank, event in evidence.events(OptimizerCount)}  # a rank's last event
    if not counts:
        return CheckResult(summary="no rank reported its optimizer steps", applicable=False)
    if len(set(counts.values())) > 1:
        spread = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(counts.items()))
        finding = Finding(check=ID, severity="warning", ranks=tuple(sorted(counts)),
                          message=f"ranks took different numbers of optimizer steps ({spread})",
                          fix="Give every rank the same number of batches (DistributedSampler, drop_last, or Join).",
                          evidence={"steps": {str(rank): count for rank, count in counts.items()}})
        return CheckResult(findings=[finding], summary=f"optimizer steps differ across ranks ({spread})")
    findings = [Finding(check=ID, severity="info", ranks=(rank,), message=f"{count} optimizer steps on rank {rank}",
                        fix="Nothing to fix.", evidence={"steps": count})
                for rank, count in sorted(counts.items())]
    return CheckResult(findings=findings, summary=f"{next(iter(counts.values()))} optimizer steps on every rank")


DOCS = """\
## What it does
Counts the optimizer steps every rank takes, with a global optimizer step post-hook installed in
each rank, and reports the count per rank. An example of a third-party check with its own probe.

## Why it matters
In data-parallel training every rank steps its optimizer equally often; ranks that step a
different number of times train on different amounts of data, or hang in the collective of the
step the others never take.

## Example
```python
for x, y in loader:            # a loader with more batches on some ranks
    loss_fn(model(x), y).backward()
    optimizer.step()
```

## Use instead
```python
loader = DataLoader(dataset, sampler=DistributedSampler(dataset, drop_last=True), batch_size=64)
```
"""

CHECK = Check(id=ID, title="Optimizer steps per rank (example plugin)", analyze=analyze, docs=DOCS,
              probe="ddpdoctor_example_plugin:install", api_version=CHECK_API_VERSION)
