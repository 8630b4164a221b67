"""buffer-sync: module buffers (BatchNorm running statistics...) stay identical across ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Finding, Location, evidence_field
from ddpdoctor.analysis.compare import group_by_value, relative_difference
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import BuffersDiffer
from ddpdoctor.schema.events import BufferFingerprint

from ._common import fmt_ranks, sharded_skip

ID = "buffer-sync"

DOCS = """\
## What it does
Fingerprints the buffers of every DDP-wrapped module at each training forward pass (after DDP's
own buffer broadcast) and compares them across ranks. Reports the first buffer that differs.

## Why it matters
With `broadcast_buffers=False` each rank keeps its own BatchNorm running mean and variance, computed
on its own shard only. Evaluation then gives different answers per rank and the checkpoint rank 0
saves holds statistics of 1/N of the data. Buffers that differ while DDP broadcasts them mean
something rewrites them between DDP's broadcast and the module's forward.

## Example
```python
model = DDP(net_with_batchnorm, broadcast_buffers=False)
```

## Use instead
```python
net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)   # statistics over the global batch
model = DDP(net)                                           # or keep broadcast_buffers=True
```
"""


@dataclass(frozen=True)
class BufferDiverged(EvidenceRecord, BuffersDiffer):
    """The first buffer that differs across ranks, at which training forward, and by how much."""

    buffer: str = evidence_field(label="buffer", unit="code", default="")
    forward: int = evidence_field(label="training forward", default=0)
    broadcast_buffers: bool = evidence_field(label="broadcast_buffers", default=True)
    rank_groups: list[list[int]] = evidence_field(hidden=True, default_factory=list)
    relative_difference: Optional[float] = evidence_field(label="relative difference", unit="fraction", keep_none=True)
    fingerprints: dict[str, Any] = evidence_field(hidden=True, default_factory=dict)


def analyze(evidence: Evidence) -> CheckResult:
    sharded = sharded_skip(evidence)
    if sharded is not None:
        return sharded
    wraps = {(r, index): e for index, per_rank in facts.ddp.wraps(evidence).items() for r, e in per_rank.items()}
    if evidence.world_size < 2 or not any(e.buffers for e in wraps.values()):
        return CheckResult(summary="no DDP module with buffers", applicable=False)
    by_forward: dict[tuple[int, int], dict[int, list]] = {}
    for rank, event in evidence.events(BufferFingerprint):
        by_forward.setdefault((event.ddp, event.forward), {})[rank] = event.fp
    compared = 0
    for (ddp_index, forward), per_rank in sorted(by_forward.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if len(per_rank) < 2:
            continue
        compared += 1
        reference = per_rank[min(per_rank)]
        if all(v == reference for v in per_rank.values()):
            continue  # bit-identical: nothing to compare value by value
        length = min(len(v) for v in per_rank.values())
        for i in range(length):
            groups = group_by_value({r: v[i] for r, v in per_rank.items()})
            if len(groups) == 1:
                continue
            ref = groups[0][0]
            wrap = wraps.get((ref, ddp_index))
            names = wrap.buffers if wrap else []
            name = names[i] if i < len(names) else f"buffer{i}"
            ranks = sorted(r for g in groups for r in g)
            diffs = [d for g in groups[1:] for r in g
                     if (d := relative_difference(per_rank[ref][i], per_rank[r][i])) is not None]
            diff = max(diffs) if diffs else None  # word sums say the bits differ, not by how much
            broadcast = wrap.broadcast_buffers if wrap else True
            if not broadcast:
                severity = "warning"
                message = (f"buffer `{name}` differs across ranks from training forward {forward} on: "
                           "DDP was built with broadcast_buffers=False, so each rank keeps statistics of its own shard")
                fix = ("Convert BatchNorm layers with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
                       "wrapping, or keep DDP's default broadcast_buffers=True.")
            else:
                severity = "error"
                message = (f"buffer `{name}` differs across ranks at training forward {forward} although DDP "
                           "broadcasts buffers: something rewrites it on some ranks between DDP's broadcast and the "
                           "forward")
                fix = "Update buffers identically on every rank, or only inside the module's forward."
            finding = Finding(check=ID, severity=severity, message=message, fix=fix, ranks=tuple(ranks),
                              location=Location.from_site(wrap.site if wrap else None),
                              evidence=BufferDiverged(
                                  buffer=name, forward=forward, broadcast_buffers=broadcast, rank_groups=groups,
                                  relative_difference=diff,
                                  fingerprints={str(r): v[i] for r, v in sorted(per_rank.items())}))
            return CheckResult(findings=[finding], summary=f"`{name}` diverges ({fmt_ranks(ranks)})")
    if compared == 0:
        return CheckResult(summary="no training forward seen on two ranks", applicable=False)
    return CheckResult(summary=f"buffers identical across ranks at {compared} compared forwards")


CHECK = Check(id=ID, title="buffers in sync", analyze=analyze, docs=DOCS, order=20, probes=('ddp', 'sharding'),
              evidence=(BufferDiverged,))
