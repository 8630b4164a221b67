"""uneven-inputs: every rank runs the same number of training steps per epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import (Check, CheckResult, EvidenceRecord, Explains, Finding, Location, Severity,
                                    evidence_field)
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.analysis.symptoms import CollectivesUnmatched, HangKind, IterationsUneven, RankFailed, UnevenCause
from ddpdoctor.schema.events import DDPUsage, JoinEvent, LoaderPass, Step

from . import _frameworks as frameworks
from ._common import fmt_ranks

ID = "uneven-inputs"

DOCS = """\
## What it does
Counts, per training pass (epoch) over each DataLoader and in total, how many batches and optimizer
steps every rank ran, and reports ranks that ran a different number. It says what happened next:
the job hung (the rank with the extra batch waits in DDP's gradient all-reduce for peers that never
come), failed ("Connection closed by peer" once a peer exits), or finished by luck. A model sharded
with FSDP2, HSDP or FSDP1 is counted the same way, from its loader passes and optimizer steps: the
rank with the extra batch waits in FSDP's next all-gather instead.

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


@dataclass(frozen=True)
class Joined(EvidenceRecord, IterationsUneven):
    """Batch counts that differ inside Join, which handles them."""

    batches: dict[str, int] = evidence_field(label="batches per rank", default_factory=dict)


@dataclass(frozen=True)
class Uneven(EvidenceRecord, IterationsUneven):
    """Ranks ran different numbers of batches or DDP iterations, and why (``cause``)."""

    cause: Optional[str] = evidence_field()  # an UnevenCause
    # the training pass (0-based); 0 for whole-run counts
    pass_: Optional[int] = evidence_field(label="pass", key="pass")
    loader: Optional[str] = evidence_field(label="loader")  # or "optimizer steps", "DDP iterations"
    batches: dict[str, int] = evidence_field(label="batches per rank", default_factory=dict)
    ddp_iterations: dict[str, int] = evidence_field(default_factory=dict)
    outcome: Optional[str] = evidence_field()  # the run's Outcome
    num_uneven_passes: Optional[int] = evidence_field(label="uneven passes")


def _uneven(finding: Finding) -> bool:
    return finding.severity == Severity.ERROR and isinstance(finding.evidence, Uneven)


def _ran_out_of_data(finding: Finding) -> bool:
    return _uneven(finding) and finding.evidence.cause == UnevenCause.DATA


def _peer_symptom(symptom: Finding) -> bool:
    """A rank that failed only with a peer's symptom (connection closed): another rank left first."""
    return isinstance(symptom.evidence, RankFailed) and bool(symptom.evidence.secondary_only)


def _left_waiting(symptom: Finding, _cause: Finding) -> bool:
    """The peer of a rank that ran out of data waits (a hang), fails when it leaves, or is left alone
    in DDP's collectives for the batches it still has."""
    hang = symptom.evidence
    return _peer_symptom(symptom) or (isinstance(hang, CollectivesUnmatched)
                                      and (hang.kind == HangKind.HANG or hang.in_ddp_internals()))


def _left_alone_in_ddp(symptom: Finding, _cause: Finding) -> bool:
    """DDP's own collectives for the iterations the others still run find no partner (no traced
    call of the user's is involved), or a peer fails when the short rank leaves."""
    hang = symptom.evidence
    return _peer_symptom(symptom) or (isinstance(hang, CollectivesUnmatched) and hang.in_ddp_internals())


EXPLAINS = (
    # A rank ran out of data: its peer waits (hang), fails when it leaves (connection closed), or is
    # left alone in DDP's collectives for the batches it still has.
    Explains("a rank ran out of data", _left_waiting, cause=_ran_out_of_data, priority=70),
    # A rank left its training loop early (a `break` on one rank): DDP's own collectives for the
    # iterations the others still run find no partner. No traced call of the user's is involved.
    Explains("ranks ran different numbers of iterations", _left_alone_in_ddp, cause=_uneven, priority=80),
)


def _cause(per_rank: dict[int, LoaderPass], counts: dict[int, int]) -> str:
    """"data" when a rank with fewer batches exhausted its loader (its share of the data is shorter);
    "control-flow" when the short rank left its loop early (break, early stop, a rank-only collective
    it waits in); "unknown" without loader passes."""
    if not per_rank:
        return UnevenCause.UNKNOWN
    most = max(counts.values())
    short = [r for r, c in counts.items() if c < most]
    exhausted = any(per_rank[r].complete for r in short if r in per_rank)
    return UnevenCause.DATA if exhausted else UnevenCause.CONTROL_FLOW


def _training_passes(evidence: Evidence) -> dict[str, dict[int, list[LoaderPass]]]:
    """loader -> rank -> that rank's passes over it that fed training, in order.

    Passes are paired across ranks by their order among a loader's training passes, not by their
    raw number: an iterator made and dropped on some ranks only (`next(iter(loader))` to log a batch,
    a framework's look at the loader) numbers the later passes differently on those ranks.
    """
    out: dict[str, dict[int, list[LoaderPass]]] = {}
    passes = facts.loaders.passes(evidence)
    for (loader, number), per_rank in sorted(passes.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for rank, event in per_rank.items():
            if event.num_batches > 0 and (event.steps > 0 or event.ddp_forwards > 0):
                out.setdefault(loader, {}).setdefault(rank, []).append(event)
    return out


def _uneven_passes(evidence: Evidence,
                   crashed: set[int]) -> list[tuple[tuple[str, int], dict[int, LoaderPass], dict[int, int]]]:
    """((loader, training pass), rank -> pass, rank -> batches) of every training pass whose batch
    counts differ across the ranks that made it."""
    found = []
    for loader, per_rank in sorted(_training_passes(evidence).items()):
        if len(per_rank) < 2:
            continue
        for ordinal in range(max(len(p) for p in per_rank.values())):
            passes = {r: p[ordinal] for r, p in per_rank.items() if ordinal < len(p)}
            if len(passes) < 2 or (crashed and not all(e.complete for e in passes.values())):
                continue
            batches = {r: e.num_batches for r, e in passes.items()}
            if len(set(batches.values())) > 1:
                found.append(((loader, ordinal), passes, batches))
    return sorted(found, key=lambda item: item[0][1])


@derived
def ddp_backwards(evidence: Evidence) -> dict[int, dict[int, int]]:
    """DDP module index -> rank -> backward passes DDP synchronized on it (the one a rank was in
    when the job stopped included); every rank that wrapped the module is listed. Empty for
    evidence written before ranks counted them."""
    out: dict[int, dict[int, int]] = {}
    for rank, event in evidence.events(DDPUsage):
        if event.backwards is None:
            return {}
        counts = out.setdefault(event.ddp, {})
        counts[rank] = max(counts.get(rank, 0), event.backwards)
    for index, wraps in facts.ddp.wraps(evidence).items():
        if index in out:
            for rank in wraps:
                out[index].setdefault(rank, 0)
    return out


def step_counts(evidence: Evidence) -> dict[int, int]:
    """rank -> its optimizer steps."""
    counts: dict[int, int] = {}
    for rank, _ in evidence.events(Step):
        counts[rank] = counts.get(rank, 0) + 1
    return counts


def _uneven_backwards(evidence: Evidence) -> Optional[dict[int, int]]:
    """rank -> DDP backward passes, for the first DDP module whose ranks ran different numbers of
    them; None when every module's ranks ran the same (or the evidence does not count them)."""
    for _, counts in sorted(ddp_backwards(evidence).items()):
        if len(counts) >= 2 and len(set(counts.values())) > 1:
            return counts
    return None


def analyze(evidence: Evidence) -> CheckResult:
    # A sharded model (FSDP2, HSDP, FSDP1) has no DDP iteration counts: its ranks' training passes
    # over their loaders and their optimizer steps say the same (and uneven inputs hang it the same way).
    sharded = facts.ddp.sharded_without_ddp(evidence)
    if evidence.world_size < 2 or not (facts.ddp.wraps(evidence) or sharded is not None):
        return CheckResult(summary="no DDP training on several ranks", applicable=False)
    stop = evidence.stop
    if stop is not None and stop.reason in ("interrupted", "timeout"):
        return CheckResult(summary="the job was stopped before its end: its step counts are cut short",
                           applicable=False)
    joined = {r for r, e in evidence.events(JoinEvent) if e.phase == "enter"}
    # A rank that crashed for its own reasons stops early: rank-failure reports that. Ranks that
    # failed only because a peer left (connection closed) may be the symptom of uneven inputs.
    failures = facts.failures.rank_failures(evidence)
    crashed = {f.rank for f in failures if not f.secondary and f.rank is not None}
    counted = bool(ddp_backwards(evidence))
    backwards = _uneven_backwards(evidence) if counted else None
    if counted and backwards is None:
        total = max((sum(c.values()) for c in ddp_backwards(evidence).values()), default=0)
        return CheckResult(summary=f"every rank ran the same number of DDP training iterations ({total} in all)")
    if counted and crashed:
        return CheckResult(summary="iteration counts cut short by a rank's own failure (rank-failure)")
    uneven = _uneven_passes(evidence, crashed)
    step_totals = step_counts(evidence)
    if not counted and not uneven and len(set(step_totals.values())) > 1 and not failures \
            and len(step_totals) == evidence.world_size:
        uneven.append((("optimizer steps", 0), {}, dict(step_totals)))
    if not uneven and backwards is not None:
        uneven.append((("DDP iterations", 0), {}, backwards))
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
            fix="Nothing to do.", evidence=Joined(batches={str(r): c for r, c in sorted(counts.items())}))])
    cause = _cause(per_rank, counts)
    if cause == UnevenCause.UNKNOWN and stop is not None and stop.reason in ("hang", "no-progress"):
        # No loader pass tells why: the counts differ because ddpdoctor stopped the ranks mid-way
        # (one waits in a collective, one is stuck elsewhere). collective-hang reports that.
        return CheckResult(summary="iteration counts cut short where the job was stopped (collective-hang)")
    if per_rank:
        where, unit = f"training pass {key[1] + 1} over the DataLoader", "training batches"
    elif key[0] == "DDP iterations":
        where, unit = "the whole run", "DDP training iterations"
    else:
        where, unit = "the whole run", "training batches"
    why = {UnevenCause.DATA: ": the ranks' shares of the data have different lengths",
           UnevenCause.CONTROL_FLOW: ": some ranks left the loop early"}.get(cause, "")
    shown = counts
    if backwards is not None and per_rank and backwards != counts:  # a loader that fetches ahead yields more
        shown, unit = backwards, "DDP training iterations"
        why += f" (its DataLoader yielded {_counts(counts)} batches)"
    message = f"ranks ran different numbers of {unit} in {where} ({_counts(shown)}) {outcome}{why}"
    fix = frameworks.fix(evidence, "uneven", (
        "Give every rank the same number of batches (DistributedSampler pads; or drop_last=True), or wrap the "
        "training loop in `with torch.distributed.algorithms.join.Join([model]):`."))
    if sharded is not None:  # Join supports DDP and ZeroRedundancyOptimizer, not FSDP
        fix = ("Give every rank the same number of batches: a DistributedSampler (it pads the shorter shards) or "
               f"drop_last=True; the model is sharded with {sharded.name}, which Join does not support.")
    if cause == UnevenCause.CONTROL_FLOW:
        fix = ("Leave the training loop on every rank together: decide a `break` or early stop on one rank and "
               "broadcast the decision (e.g. all_reduce a flag) so every rank takes it"
               + ("." if sharded is not None else
                  "; or wrap the loop in `with torch.distributed.algorithms.join.Join([model]):`."))
    finding = Finding(
        check=ID, severity="error", ranks=ranks, location=Location.from_site(site), message=message, fix=fix,
        evidence=Uneven(cause=cause, pass_=key[1], loader=key[0],
                        batches={str(r): c for r, c in sorted(counts.items())},
                        ddp_iterations={str(r): c for r, c in sorted((backwards or {}).items())},
                        outcome=evidence.outcome, num_uneven_passes=len(uneven)),
    )
    return CheckResult(findings=[finding], summary=f"uneven step counts ({fmt_ranks(ranks)})")


def _counts(counts: dict[int, int]) -> str:
    return ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))


CHECK = Check(id=ID, title="same number of steps on every rank", analyze=analyze, docs=DOCS, order=70,
              probes=('ddp', 'optimizer', 'data', 'join', 'sharding'),
              evidence=(Joined, Uneven), explains=EXPLAINS)
