"""not-distributed: the script never initialized a process group or never trained through DDP."""

from __future__ import annotations

from ddpdoctor.analysis.api import Check, CheckResult, Finding
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.schema.events import InitProcessGroup, Step

from ._common import first_site

ID = "not-distributed"

DOCS = """\
## What it does
Says plainly when there was nothing distributed to check: the script never called
`torch.distributed.init_process_group`, or it did but never wrapped a model in
`DistributedDataParallel` (then gradients are only in sync if the script averages them by hand,
which the gradient-sync check verifies).

## Why it matters
Launched with torchrun, a script that never joins a process group trains N independent copies of
the same model on the same data: N times the cost for one model's worth of training, and every
copy writes the same files.

## Example
```python
model = Net()
for x, y in DataLoader(dataset, shuffle=True):
    ...                                   # no init_process_group, no DDP
```

## Use instead
```python
dist.init_process_group(backend)          # "nccl" on GPUs, "gloo" on CPUs
model = DistributedDataParallel(Net().to(device), device_ids=[local_rank] if cuda else None)
sampler = DistributedSampler(dataset)
```
"""


def analyze(evidence: Evidence) -> CheckResult:
    facts = evidence.facts
    if not evidence.ranks and not evidence.unranked:
        return CheckResult(summary="no rank produced evidence", applicable=False)
    if facts.failures or evidence.stop is not None:
        # The script did not run to its end: what it never reached proves nothing (rank-failure says why).
        return CheckResult(summary="the job did not run to its end", applicable=False)
    if not facts.has_process_group:
        ranks = tuple(sorted(evidence.ranks))
        copies = f"{len(ranks)} independent copies of the script ran" if len(ranks) > 1 else "the script ran alone"
        return CheckResult(summary="no process group", findings=[Finding(
            check=ID, severity="error", ranks=ranks, location=None,
            message=f"the script never called torch.distributed.init_process_group: {copies}, nothing was distributed",
            fix=("Call torch.distributed.init_process_group(backend) at start-up (env:// picks up torchrun's "
                 "variables), wrap the model in DistributedDataParallel and shard data with DistributedSampler."),
            evidence={"kind": "no-process-group", "processes": len(evidence.ranks) + (1 if evidence.unranked else 0)},
        )])
    if facts.ddp_wraps:
        return CheckResult(summary="process group initialized and model wrapped in DDP")
    steps = [e for _, e in evidence.events(Step)]
    location = first_site(evidence, InitProcessGroup)
    if not steps:
        return CheckResult(summary="no DDP model, no training step", findings=[Finding(
            check=ID, severity="warning", ranks=tuple(sorted(evidence.ranks)), location=location,
            message="a process group was initialized but no model was wrapped in DistributedDataParallel and no "
                    "optimizer stepped: there was no distributed training to check",
            fix="Wrap the model in DistributedDataParallel and train through it, or run a script that trains.",
            evidence={"kind": "no-training", "optimizer_steps": 0})])
    divergence, compared = facts.divergence
    if compared and divergence is None:
        return CheckResult(summary="no DDP, gradients synchronized by hand", findings=[Finding(
            check=ID, severity="info", ranks=tuple(sorted(evidence.ranks)), location=location,
            message=f"no model is wrapped in DistributedDataParallel, yet gradients matched across ranks in "
                    f"{compared} steps: they are averaged by hand",
            fix="Consider DistributedDataParallel: it overlaps the all-reduce with the backward pass.",
            evidence={"kind": "averaged-by-hand", "steps_compared": compared})])
    return CheckResult(summary="no DDP model", findings=[Finding(
        check=ID, severity="warning", ranks=tuple(sorted(evidence.ranks)), location=location,
        message="a process group was initialized but the model was never wrapped in DistributedDataParallel",
        fix="Wrap the model: `model = DistributedDataParallel(model)`, and train through the wrapper.",
        evidence={"kind": "no-ddp", "optimizer_steps": len(steps)})])


CHECK = Check(id=ID, title="distributed training present", analyze=analyze, docs=DOCS)
