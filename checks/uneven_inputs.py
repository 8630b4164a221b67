"""uneven-inputs: every rank runs the same number of training steps per epoch."""

from __future__ import annotations

from ddpdoctor.analysis.api import Check, CheckResult, Finding, Location
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.schema.events import JoinEvent, LoaderPass

from ._common import fmt_ranks

ID = "uneven-inputs"

DOCS = """\
## What it does
Counts, per training pass (epoch) over each DataLoader and in total, how many batches and optimizer
steps every rank ran, and reports ranks that ran a different number. It says what happened next:
the job hung (the rank with the extra batch waits in DDP's gradient all-reduce for peers that never
come), failed ("Connection closed by peer" once a peer exits), or finished by luck.

## Why it matters
DDP's backward is a collective: every rank must run the same number of synchronized backward passes.
Hand-made shards, `IterableDataset`s, filtering per rank, or a `break` on one rank give ranks
different step counts, and the job hangs at the end of an epoch until the 10-30 minute backend
timeout kills it.

## Example
```python
shard = torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size))  # sizes differ
for x, y in DataLoader(shard, batch_size=32):
    loss_fn(model(x), y).backward()
```

## Use instead
```python
from torch.distributed.algorithms.join import Join
with Join([model]):
    for x, y in loader:
        ...
```
or give every rank the same number of batches: `DistributedSampler` (pads to equal size) or
`drop_last=True`.
"""


def _cause(per_rank: dict[int, LoaderPass], counts: dict[int, int]) -> str:
    """"data" when a rank with fewer batches exhausted its loader (its share of the data is shorter);
    "control-flow" when the short rank left its loop early (break, early stop, a rank-only collective
    it waits in); "unknown" without loader passes."""
    if not per_rank:
        return "unknown"
    most = max(counts.values())
    short = [r for r, c in counts.items() if c < most]
    return "data" if any(per_rank[r].complete for r in short if r in per_rank) else "control-flow"


def analyze(evidence: Evidence) -> CheckResult:
    facts = evidence.facts
    if evidence.world_size < 2 or not facts.ddp_wraps:
        return CheckResult(summary="no DDP training on several ranks", applicable=False)
    joined = {r for r, e in evidence.events(JoinEvent) if e.phase == "enter"}
    # A rank that crashed for its own reasons stops early: rank-failure reports that. Ranks that
    # failed only because a peer left (connection closed) may be the symptom of uneven inputs.
    crashed = {f.rank for f in facts.failures if not f.secondary and f.rank is not None}
    uneven = []
    for key, per_rank in sorted(facts.loader_passes.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if len(per_rank) < 2 or not any(e.steps > 0 or e.ddp_forwards > 0 for e in per_rank.values()):
            continue
        if crashed and not all(e.complete for e in per_rank.values()):
            continue
        batches = {r: e.num_batches for r, e in per_rank.items()}
        if len(set(batches.values())) > 1:
            uneven.append((key, per_rank, batches))
    step_totals = facts.step_counts
    if not uneven and len(set(step_totals.values())) > 1 and not facts.failures \
            and len(step_totals) == evidence.world_size:
        uneven.append((("optimizer steps", 0), {}, dict(step_totals)))
    if not uneven:
        return CheckResult(summary="every rank ran the same number of steps")
    key, per_rank, counts = uneven[0]
    ranks = tuple(sorted(counts))
    outcome = {"hung": "then hung", "failed": "then failed", "timeout": "then ran into --timeout"}.get(
        evidence.outcome, "and the job finished anyway")
    site = next((e.site for e in per_rank.values() if e.site), None)
    if joined and joined >= set(counts):
        return CheckResult(summary="uneven inputs handled by Join", findings=[Finding(
            check=ID, severity="info", ranks=ranks, location=Location.from_site(site),
            message=f"ranks ran different numbers of batches ({_counts(counts)}) inside Join, which handles it",
            fix="Nothing to do.", evidence={"batches": {str(r): c for r, c in sorted(counts.items())}})])
    cause = _cause(per_rank, counts)
    where = f"pass {key[1]} over the DataLoader" if per_rank else "the whole run"
    why = {"data": ": the ranks' shares of the data have different lengths",
           "control-flow": ": some ranks left the loop early"}.get(cause, "")
    message = f"ranks ran different numbers of training batches in {where} ({_counts(counts)}) {outcome}{why}"
    finding = Finding(
        check=ID, severity="error", ranks=ranks, location=Location.from_site(site), message=message,
        fix=("Give every rank the same number of batches (DistributedSampler pads; or drop_last=True), or wrap the "
             "training loop in `with torch.distributed.algorithms.join.Join([model]):`."),
        evidence={"cause": cause, "pass": key[1], "loader": key[0],
                  "batches": {str(r): c for r, c in sorted(counts.items())},
                  "outcome": evidence.outcome, "num_uneven_passes": len(uneven)},
    )
    return CheckResult(findings=[finding], summary=f"uneven step counts ({fmt_ranks(ranks)})")


def _counts(counts: dict[int, int]) -> str:
    return ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))


CHECK = Check(id=ID, title="same number of steps on every rank", analyze=analyze, docs=DOCS)
