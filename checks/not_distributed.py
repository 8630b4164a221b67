"""not-distributed: the script never initialized a process group or never trained through DDP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import (Check, CheckResult, EvidenceRecord, Explains, Finding, Location, Severity,
                                    evidence_field)
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import EpochNotSet, IterationsUneven, NotDistributed, ReplicasDiverged, SamplesOverlap
from ddpdoctor.schema.events import DataParallelWrap, InitProcessGroup, Step

from ._common import first_site

ID = "not-distributed"

DOCS = """\
## What it does
Says plainly when there was nothing distributed to check: the script never called
`torch.distributed.init_process_group`, or it did but never wrapped a model in
`DistributedDataParallel` (then gradients are only in sync if the script averages them by hand,
which the gradient-sync check verifies).

A model sharded or replicated by another data-parallel API (FSDP2's `fully_shard`, HSDP on a
2-D mesh, FSDP1's `FullyShardedDataParallel`, the composable `replicate()`) is distributed
training: no finding, and the summary says what was found ("distributed training with FSDP2 on
a 1-D mesh of 2").

A model wrapped in single-process `nn.DataParallel` (and in no DDP) under a multi-process launch
is named as the cause, at the line that wraps it, with or without a process group: DataParallel
splits each batch over the GPUs of its own process only, so `torchrun --nproc-per-node=N` runs N
copies, each over all the GPUs it sees, and nothing is averaged across processes. What follows
from it (every process drawing the whole dataset, replicas that drift apart) is listed as its
consequence.

## Why it matters
Launched with torchrun, a script that never joins a process group trains N independent copies of
the same model on the same data: N times the cost for one model's worth of training, and every
copy writes the same files.

## Example
```python
model = Net()
for x, y in DataLoader(dataset, shuffle=True):
    ...                                   # no init_process_group, no DDP

model = nn.DataParallel(Net()).to(device) # under torchrun: one independent copy per process
```

## Use instead
```python
dist.init_process_group(backend)          # "nccl" on GPUs, "gloo" on CPUs
model = DistributedDataParallel(Net().to(device), device_ids=[local_rank] if cuda else None)
sampler = DistributedSampler(dataset)
```
or keep `nn.DataParallel` and start one plain `python train.py` process instead of torchrun.
"""

NO_PROCESS_GROUP, DATA_PARALLEL = "no-process-group", "data-parallel"


@dataclass(frozen=True)
class NoProcessGroup(EvidenceRecord, NotDistributed):
    """The script never called init_process_group: independent copies ran."""

    discriminator = {"kind": NO_PROCESS_GROUP}
    kind: str = evidence_field(hidden=True, default=NO_PROCESS_GROUP)
    processes: Optional[int] = evidence_field(label="processes")


@dataclass(frozen=True)
class NoTraining(EvidenceRecord, NotDistributed):
    """A process group, but no DDP model and no optimizer step."""

    discriminator = {"kind": "no-training"}
    kind: str = evidence_field(hidden=True, default="no-training")
    optimizer_steps: Optional[int] = evidence_field(label="optimizer steps")


@dataclass(frozen=True)
class AveragedByHand(EvidenceRecord, NotDistributed):
    """No DDP, yet the gradients matched across ranks: the script averages them itself."""

    discriminator = {"kind": "averaged-by-hand"}
    kind: str = evidence_field(hidden=True, default="averaged-by-hand")
    steps_compared: Optional[int] = evidence_field(label="steps compared")


@dataclass(frozen=True)
class NoDdp(EvidenceRecord, NotDistributed):
    """A process group and optimizer steps, but no model wrapped in DDP."""

    discriminator = {"kind": "no-ddp"}
    kind: str = evidence_field(hidden=True, default="no-ddp")
    optimizer_steps: Optional[int] = evidence_field(label="optimizer steps")


@dataclass(frozen=True)
class DataParallelWrapped(EvidenceRecord, NotDistributed):
    """nn.DataParallel in every process of a multi-process launch (``kind``: "data-parallel", or
    "no-process-group" when the script never called init_process_group either)."""

    kind: Optional[str] = evidence_field(hidden=True)
    module: Optional[str] = evidence_field()
    device_ids: list[int] = evidence_field(default_factory=list)
    processes: Optional[int] = evidence_field(label="processes")


def _never_distributed(finding: Finding) -> bool:
    """No process group at all, or nn.DataParallel in every process: independent copies of the script."""
    return (finding.severity in (Severity.ERROR, Severity.WARNING)
            and isinstance(finding.evidence, (NoProcessGroup, DataParallelWrapped))
            and finding.evidence.kind in (NO_PROCESS_GROUP, DATA_PARALLEL))


def _disagreement_of_copies(symptom: Finding, _cause: Finding) -> bool:
    """What independent copies disagree on: the samples they draw, their replicas, their epochs, their
    batch counts."""
    return isinstance(symptom.evidence, (SamplesOverlap, ReplicasDiverged, EpochNotSet, IterationsUneven))


EXPLAINS = (
    # No process group at all, or nn.DataParallel in every process: independent copies of the
    # script; what they disagree on follows.
    Explains("never distributed", _disagreement_of_copies, cause=_never_distributed, priority=40),
)

_DATA_PARALLEL_FIX = (
    "Use one process per GPU with DDP: `dist.init_process_group(\"nccl\")`, "
    "`torch.cuda.set_device(local_rank)` with `local_rank = int(os.environ[\"LOCAL_RANK\"])`, "
    "`model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])` and a `DistributedSampler` "
    "for the data; or keep nn.DataParallel and start one plain `python train.py` process, not torchrun.")


def _data_parallel(evidence: Evidence) -> Optional[tuple[Optional[Location], DataParallelWrap]]:
    """Where the first model was wrapped in nn.DataParallel, when ranks of a multi-process launch did."""
    if len(evidence.ranks) < 2:
        return None  # one process: DataParallel is how it uses its GPUs
    for _, event in evidence.events(DataParallelWrap):
        return Location.from_site(event.site), event
    return None


def _data_parallel_finding(evidence: Evidence, where: tuple[Optional[Location], DataParallelWrap], *,
                           process_group: bool) -> Finding:
    location, event = where
    ranks = tuple(sorted(evidence.ranks))
    wrapped = (f"the model ({event.module}) is wrapped in nn.DataParallel" +
               ("" if process_group else " and the script never called torch.distributed.init_process_group"))
    tail = (f"each of the {len(ranks)} processes trains its own copy over the GPUs it sees (DataParallel splits "
            "batches within one process only) and nothing is averaged across processes")
    return Finding(
        check=ID, severity="error", ranks=ranks, location=location,
        message=(f"{wrapped}, not in DistributedDataParallel: {tail}" if process_group else f"{wrapped}: {tail}"),
        fix=_DATA_PARALLEL_FIX,
        evidence=DataParallelWrapped(kind=DATA_PARALLEL if process_group else NO_PROCESS_GROUP, module=event.module,
                                     device_ids=list(event.device_ids),
                                     processes=len(evidence.ranks) + (1 if evidence.unranked else 0)))


def analyze(evidence: Evidence) -> CheckResult:
    if not evidence.ranks and not evidence.unranked:
        return CheckResult(summary="no rank produced evidence", applicable=False)
    if facts.failures.rank_failures(evidence) or evidence.stop is not None:
        # The script did not run to its end: what it never reached proves nothing (rank-failure says why).
        return CheckResult(summary="the job did not run to its end", applicable=False)
    sharding = facts.ddp.sharding(evidence)  # fully_shard, FSDP1, replicate(): distributed, without the DDP class
    wrapped, process_group = bool(facts.ddp.wraps(evidence)), facts.ddp.has_process_group(evidence)
    data_parallel = None if wrapped or sharding is not None else _data_parallel(evidence)
    if data_parallel is not None:
        summary = "nn.DataParallel in every process" + ("" if process_group else ", no process group")
        return CheckResult(summary=summary, findings=[
            _data_parallel_finding(evidence, data_parallel, process_group=process_group)])
    if not process_group and sharding is None:
        ranks = tuple(sorted(evidence.ranks))
        copies = f"{len(ranks)} independent copies of the script ran" if len(ranks) > 1 else "the script ran alone"
        return CheckResult(summary="no process group", findings=[Finding(
            check=ID, severity="error", ranks=ranks, location=None,
            message=f"the script never called torch.distributed.init_process_group: {copies}, nothing was distributed",
            fix=("Call torch.distributed.init_process_group(backend) at start-up (env:// picks up torchrun's "
                 "variables), wrap the model in DistributedDataParallel and shard data with DistributedSampler."),
            evidence=NoProcessGroup(processes=len(evidence.ranks) + (1 if evidence.unranked else 0)),
        )])
    if wrapped:
        return CheckResult(summary="process group initialized and model wrapped in DDP")
    if sharding is not None:
        return CheckResult(summary=f"distributed training with {sharding.describe()}")
    steps = [e for _, e in evidence.events(Step)]
    location = first_site(evidence, InitProcessGroup)
    if not steps:
        return CheckResult(summary="no DDP model, no training step", findings=[Finding(
            check=ID, severity="warning", ranks=tuple(sorted(evidence.ranks)), location=location,
            message="a process group was initialized but no model was wrapped in DistributedDataParallel and no "
                    "optimizer stepped: there was no distributed training to check",
            fix="Wrap the model in DistributedDataParallel and train through it, or run a script that trains.",
            evidence=NoTraining(optimizer_steps=0))])
    divergence, compared = facts.steps.divergence(evidence)
    if compared and divergence is None:
        return CheckResult(summary="no DDP, gradients synchronized by hand", findings=[Finding(
            check=ID, severity="info", ranks=tuple(sorted(evidence.ranks)), location=location,
            message=f"no model is wrapped in DistributedDataParallel, yet gradients matched across ranks in "
                    f"{compared} steps: they are averaged by hand",
            fix="Consider DistributedDataParallel: it overlaps the all-reduce with the backward pass.",
            evidence=AveragedByHand(steps_compared=compared))])
    return CheckResult(summary="no DDP model", findings=[Finding(
        check=ID, severity="warning", ranks=tuple(sorted(evidence.ranks)), location=location,
        message="a process group was initialized but the model was never wrapped in DistributedDataParallel",
        fix="Wrap the model: `model = DistributedDataParallel(model)`, and train through the wrapper.",
        evidence=NoDdp(optimizer_steps=len(steps)))])


CHECK = Check(id=ID, title="distributed training present", analyze=analyze, docs=DOCS, order=100,
              probes=('data_parallel', 'sharding'),
              evidence=(NoProcessGroup, NoTraining, AveragedByHand, NoDdp, DataParallelWrapped), explains=EXPLAINS)
