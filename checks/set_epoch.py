"""set-epoch: a shuffling DistributedSampler gets a new epoch every pass, so the order changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import EpochNotSet
from ddpdoctor.schema.events import LoaderPass

from ._common import fmt_ranks
from ._content import StreamOrderRepeated, repeated_order_findings

ID = "set-epoch"

DOCS = """\
## What it does
Watches every training pass (one with optimizer steps) over a DataLoader whose sampler is a
shuffling `DistributedSampler` and records the sampler's epoch at the start of the pass. \
Two or more passes with the same epoch mean
`sampler.set_epoch(epoch)` was not called each epoch.
An `IterableDataset` has no sampler to watch: there, two consecutive training passes that feed
exactly the same samples in exactly the same order (by content fingerprint) mean the stream is
never reshuffled between epochs.

## Why it matters
`DistributedSampler` shuffles with `seed + epoch`. Without `set_epoch`, every epoch visits the
samples in exactly the same order and every rank keeps exactly the same shard for the whole run:
the shuffling you asked for never happens, which hurts convergence.

## Example
```python
sampler = DistributedSampler(dataset, shuffle=True)
loader = DataLoader(dataset, sampler=sampler, batch_size=64)
for epoch in range(epochs):
    for x, y in loader:          # same order every epoch
        ...
```

## Use instead
```python
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        ...
```
"""


@dataclass(frozen=True)
class SamplerEpochRepeated(EvidenceRecord, EpochNotSet):
    """A shuffling DistributedSampler iterated in several training passes with the same epoch."""

    loader: str = evidence_field(label="loader", default="")  # the loader and its dataset's length
    sampler_epochs: list[Optional[int]] = evidence_field(label="sampler epoch in each pass", default_factory=list)
    identical_order: bool = evidence_field(label="same order every pass", default=False)


def analyze(evidence: Evidence) -> CheckResult:
    passes: dict[tuple[int, str], dict[int, LoaderPass]] = {}  # (rank, loader|dataset size) -> pass number -> event
    for (loader, number), per_rank in facts.loaders.passes(evidence).items():
        for rank, event in per_rank.items():
            sampler = event.sampler
            # Training passes only: evaluating on the training loader within an epoch reuses its epoch legitimately.
            if sampler.distributed and sampler.shuffle and event.steps > 0:
                passes.setdefault((rank, f"{loader}|{event.dataset_len}"), {})[number] = event
    multi = {k: [v[n] for n in sorted(v)] for k, v in passes.items() if len(v) >= 2}
    streams = repeated_order_findings(ID, evidence)
    if not multi and streams:
        ranks = sorted({r for f in streams for r in f.ranks})
        return CheckResult(findings=streams, summary=f"stream repeats its order every epoch ({fmt_ranks(ranks)})")
    if not multi:
        return CheckResult(summary="no shuffling DistributedSampler iterated twice", applicable=False)
    stale: dict[str, dict] = {}
    for (rank, loader), events in sorted(multi.items()):
        epochs = [e.sampler.epoch for e in events]
        if len(set(epochs)) < len(epochs):
            entry = stale.setdefault(loader, {"ranks": [], "epochs": epochs, "site": events[0].site,
                                              "orders": [e.order for e in events]})
            entry["ranks"].append(rank)
    if not stale and not streams:
        return CheckResult(summary=f"{len(multi)} shuffling sampler(s) got a new epoch every pass")
    findings = []
    for loader, info in stale.items():
        epochs = info["epochs"]
        repeated = sorted({e for e in epochs if epochs.count(e) > 1}, key=lambda x: (x is None, x))
        same_order = len(set(o for o in info["orders"] if o)) < len([o for o in info["orders"] if o])
        findings.append(Finding(
            check=ID, severity="warning",
            message=(f"DistributedSampler with shuffle=True was iterated {len(epochs)} times with sampler epoch "
                     f"{', '.join(map(str, repeated))} repeated: set_epoch() is not called each epoch, so every "
                     "epoch sees the same order and every rank the same shard"),
            fix="Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the DataLoader.",
            ranks=tuple(info["ranks"]), location=Location.from_site(info["site"]),
            evidence=SamplerEpochRepeated(loader=loader, sampler_epochs=epochs, identical_order=same_order),
        ))
    findings += streams
    ranks = sorted({r for f in findings for r in f.ranks})
    return CheckResult(findings=findings, summary=f"set_epoch missing ({fmt_ranks(ranks)})")


CHECK = Check(id=ID, title="set_epoch every epoch", analyze=analyze, docs=DOCS, order=40, probes=('data', 'content'),
              evidence=(StreamOrderRepeated, SamplerEpochRepeated))
