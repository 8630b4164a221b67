"""collective-hang: ranks meet in the same collectives in the same order; hangs are explained."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import (Check, CheckResult, EvidenceRecord, Explains, Finding, Location, RUN, POSTMORTEM,
                                    Severity, evidence_field)
from ddpdoctor.analysis.decode import COLLECTIVE_MISMATCH
from ddpdoctor.analysis.evidence import Evidence, RankEvidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.analysis.facts.failures import RankFailure
from ddpdoctor.analysis.symptoms import (CollectivesUnmatched, FailureKind, HangKind, IterationsUneven, RankFailed,
                                         UnevenCause)
from ddpdoctor.schema.events import Collective
from ddpdoctor.schema.findings import ABSENT
from ddpdoctor.analysis.watchdog_timeout import timed_out_ranks
from ddpdoctor.analysis.collective_trace import (Mismatch, RankTrace, TraceEntry, first_mismatch,
                                                 first_subgroup_mismatch, subgroup_traces)
from ddpdoctor.schema.observations import RankState, StopSnapshot

from ._common import fmt_ranks, short_site

ID = "collective-hang"

DOCS = """\
## What it does
Traces every torch.distributed collective each rank calls (op, sequence number, tensor shapes and
dtypes, call site) at no extra communication cost, FSDP's all-gathers and reduce-scatters included
(at the user's forward or `loss.backward()` line), and a watchdog thread in every rank reports
progress. It reports:

- **a hang**: a rank without progress for `--hang-timeout` seconds (default max(30 s, 10x the
  slowest step)). ddpdoctor collects every rank's Python stack, even while it is blocked in C++,
  stops the job, and says where each rank waits (op, file:line, stack), which ranks never arrived
  or already exited, and the first collective at which the ranks' traces differ;
- **a mismatch without a hang**: at the same sequence number ranks called different collectives or
  passed tensors of different shape or dtype (which gloo and NCCL may silently mis-reduce, or
  raise about at once, as gloo does for an all_gather whose size differs by rank);
- **a collective some ranks issued and the others never did, that a rank died over**: DDP's own
  collectives count, booked to the line that caused them. A forward through the DDP wrapper on
  rank 0 only (an evaluation under `if rank == 0:`) broadcasts DDP's buffers, which gloo pairs with
  whatever the other ranks are in: on the iteration DDP rebuilds its buckets, their bucket-order
  broadcast, whose size differs, and gloo aborts them ("Received data size doesn't match expected
  size ... collective mismatch", SIGABRT). The rank-only forward is the root, at its line; the
  abort, and the "Connection reset by peer" that follows on the rank that ran the forward, are its
  consequences. When a rank crashed first (killed, an exception), the collective its peers were
  left waiting in is the crash's consequence, whether they then raised ("Connection closed by
  peer") or torchrun stopped them before they could (NCCL's survivors never notice a dead peer):
  ddpdoctor's torchrun asks the survivors to write what they hold before it stops them.

A rank busy in code that is not communication (a large `torch.save`, a DataLoader waiting on
slow storage, its own computation) is not hung: the job counts as hung only when every rank still
running waits for its peers. A stall that is not provably a hang is reported as "no progress"
with the stacks, and stops the job only after ten times the hang timeout.

`ddpdoctor analyze` judges the ranks' flight recorder dumps the same way, with one more proof: a
rank's collective that had been pending for its whole timeout (the `timeout_ms` its entry records)
when the rank dumped. The watchdog dumps at that moment (NCCL with TORCH_NCCL_DUMP_ON_TIMEOUT), so
the job did hang: a rank that was in its own code then never came, and it is the error, named at
the last line its dump shows. Dumps taken on demand, or at a stop from outside, prove no timeout.

## Why it matters
A collective called by only some ranks (a barrier under `if rank == 0:`, a metric all_reduce inside
a rank check, early stopping decided on one rank) hangs the job silently for the backend timeout,
10 to 30 minutes, then dies without saying where.

## Example
```python
if rank == 0:
    validate(model)            # validate() calls dist.barrier(): rank 1 never joins
```

## Use instead
Call every collective on every rank, in the same order, with the same shapes. Run evaluation on all
ranks (sharded) or keep rank-0-only code free of collectives; broadcast decisions such as early
stopping so every rank acts on them together.
"""


@dataclass(frozen=True)
class NoProgress(EvidenceRecord, CollectivesUnmatched):
    """No rank made progress, but not every rank waits in a collective: not proven to be a hang."""

    discriminator = {"kind": HangKind.NO_PROGRESS.value}
    kind: str = evidence_field(hidden=True, default=HangKind.NO_PROGRESS)
    threshold_s: Optional[float] = evidence_field(hidden=True, keep_none=True)
    ranks: dict[str, dict[str, Any]] = evidence_field(hidden=True, unit="rank-states", default_factory=dict)
    sequence: Optional[int] = evidence_field(hidden=True, keep_none=True)
    group: Optional[list[int]] = evidence_field(keep_none=True)


@dataclass(frozen=True)
class Hung(EvidenceRecord, CollectivesUnmatched):
    """The job hung: every rank still running waits for its peers. The fields from ``timeout_s`` to
    ``never_called_by`` only where the watchdog's dumps show ranks that never arrived."""

    discriminator = {"kind": HangKind.HANG.value}
    kind: str = evidence_field(hidden=True, default=HangKind.HANG)
    threshold_s: Optional[float] = evidence_field(hidden=True, keep_none=True)
    timeout_s: Optional[float] = evidence_field(label="timeout", unit="s", default=ABSENT)
    ranks: dict[str, dict[str, Any]] = evidence_field(hidden=True, unit="rank-states", default_factory=dict)
    culprit: Optional[int] = evidence_field(hidden=True, default=ABSENT)
    called_by: Optional[list[int]] = evidence_field(label="called by", unit="ranks", default=ABSENT)
    never_called_by: Optional[list[int]] = evidence_field(label="never called by", unit="ranks", default=ABSENT)
    first_divergence: Optional[int] = evidence_field(hidden=True, unit="divergence", keep_none=True)
    sequence: Optional[int] = evidence_field(hidden=True, keep_none=True)
    group: Optional[list[int]] = evidence_field(keep_none=True)
    culprit_phase: Optional[str] = evidence_field(hidden=True, keep_none=True)
    timeline: dict[str, dict[str, str]] = evidence_field(hidden=True, unit="collective-timeline", default_factory=dict)


@dataclass(frozen=True)
class Orphaned(EvidenceRecord, CollectivesUnmatched):
    """A rank died in a collective its peers never called. The ``rank_only`` fields where DDP's own
    collectives from one line (a forward through the wrapper) ran on some ranks only."""

    discriminator = {"kind": HangKind.ORPHAN.value}
    kind: str = evidence_field(hidden=True, default=HangKind.ORPHAN)
    sequence: Optional[int] = evidence_field(hidden=True, keep_none=True)
    called_by: list[int] = evidence_field(label="called by", unit="ranks", default_factory=list)
    never_called_by: list[int] = evidence_field(label="never called by", unit="ranks", default_factory=list)
    site: Any = evidence_field(hidden=True, keep_none=True)
    culprit_phase: Optional[str] = evidence_field(hidden=True, keep_none=True)
    rank_only: Optional[str] = evidence_field(hidden=True, default=ABSENT)
    never_ran: list[int] = evidence_field(label="never ran it", unit="ranks", default=ABSENT)
    collectives_from_line: dict[str, int] = evidence_field(label="collectives from that line", default=ABSENT)


@dataclass(frozen=True)
class Mismatched(EvidenceRecord, CollectivesUnmatched):
    """At one sequence number the ranks called different collectives, or with different tensors."""

    discriminator = {"kind": HangKind.MISMATCH.value}
    kind: str = evidence_field(hidden=True, default=HangKind.MISMATCH)
    sequence: Optional[int] = evidence_field(hidden=True, keep_none=True)
    culprit: Optional[int] = evidence_field(hidden=True, keep_none=True)
    culprit_phase: Optional[str] = evidence_field(hidden=True, keep_none=True)
    group: Optional[list[int]] = evidence_field(keep_none=True)
    calls: dict[str, dict[str, Any]] = evidence_field(hidden=True, unit="rank-calls", default_factory=dict)
    rank_only: Optional[str] = evidence_field(hidden=True, default=ABSENT)
    never_ran: list[int] = evidence_field(label="never ran it", unit="ranks", default=ABSENT)
    collectives_from_line: dict[str, int] = evidence_field(label="collectives from that line", default=ABSENT)


@dataclass(frozen=True)
class Stalled(EvidenceRecord):
    """A stall that resolved by itself (not a hang, no collective unmatched): where each rank was."""

    discriminator = {"kind": HangKind.STALL.value}
    kind: str = evidence_field(hidden=True, default=HangKind.STALL)
    ranks: dict[str, dict[str, Any]] = evidence_field(hidden=True, unit="rank-states", default_factory=dict)


def _diverged(finding: Finding) -> bool:
    return finding.severity == Severity.ERROR and isinstance(finding.evidence, CollectivesUnmatched)


def _follows_the_divergence(symptom: Finding, cause: Finding) -> bool:
    """Batch counts that differ by control flow (or for no known reason), or a rank failure inside the
    collective whose calls differ (gloo raises at once on a size mismatch), or only with a peer's
    symptom (connection closed) once the ranks diverged, or gloo aborting it on a collective mismatch
    (its own output says so; a killed rank records no number of the collective it died in)."""
    failed, hang = symptom.evidence, cause.evidence
    if isinstance(failed, IterationsUneven):
        return failed.cause in (UnevenCause.CONTROL_FLOW, UnevenCause.UNKNOWN)
    if not isinstance(failed, RankFailed) or not isinstance(hang, CollectivesUnmatched):
        return False
    sequence = hang.sequence
    aborted = failed.error_code == COLLECTIVE_MISMATCH
    return bool(failed.secondary_only) or (aborted and sequence is not None) or (
        sequence is not None and failed.seq is not None and failed.seq >= sequence)


def _stopped_by_timeout(symptom: Finding, _cause: Finding) -> bool:
    return isinstance(symptom.evidence, RankFailed) and symptom.evidence.kind == FailureKind.TIMEOUT


EXPLAINS = (
    # Ranks took different collectives: the batch counts they reached differ as a result.
    Explains("collectives diverged", _follows_the_divergence, cause=_diverged, priority=90),
    # The ranks were stuck in mismatched or partnerless collectives when --timeout expired: the stop
    # is the hang's consequence, not a second fault (a job merely slow keeps its timeout finding).
    Explains("a hang outlasted --timeout", _stopped_by_timeout, cause=_diverged, priority=110),
)


def _describe(entry: Optional[TraceEntry]) -> str:
    if entry is None:
        return "nothing (no collective with this number)"
    return f"{entry.describe()} at {short_site(Location.from_site(entry.site))}"


def _verb(entry: TraceEntry) -> str:
    return "issued" if entry.internal else "called"


@derived
def collective_mismatch(evidence: Evidence) -> Optional[Mismatch]:
    """First number at which ranks that reached it issued different collectives or shapes."""
    return first_mismatch(facts.collectives.world_traces(evidence), include_missing=False)


@derived
def subgroup_mismatch(evidence: Evidence) -> Optional[Mismatch]:
    """The first call at which a subgroup's members issued different collectives or shapes
    (``group`` names its global ranks)."""
    missing = set(evidence.observations.missing_ranks)
    return first_subgroup_mismatch(subgroup_traces(
        {rank: ev.of(Collective) for rank, ev in evidence.ranks.items() if rank not in missing}))


def _several_hosts(evidence: Evidence) -> bool:
    """The ranks ran on more than one host: a rank is then named with its host."""
    return len({ev.host for ev in evidence.ranks.values() if ev.host}) > 1


def _rank_states(evidence: Evidence, stop: StopSnapshot) -> dict[str, dict]:
    traces = facts.collectives.world_traces(evidence)
    states: dict[str, dict] = {}
    for rank, state in sorted(stop.ranks.items()):
        if state.state == "never started":
            states[str(rank)] = {"state": "never started"}
            continue
        beat = state.heartbeat
        user = [f for f in state.stack if f.get("user")]
        ev = evidence.ranks.get(rank)
        last = _last_traced(traces.get(rank), ev) or (beat.last_collective if beat else None)
        states[str(rank)] = {
            "host": (ev.host if ev else None) or (beat.host if beat else None) or None,
            "state": state.state,
            "waiting_in": state.waiting_in,
            "activity": beat.activity if beat else None,
            "stalled_s": state.stalled_s,
            "steps": beat.steps if beat and evidence.counts_steps else None,  # a dump's heartbeat counts none
            "last_collective": last,
            "where": user[-1] if user else None,
            "stack": [f"{f['file']}:{f['line']} in {f['function']}" for f in state.stack[-8:]],
        }
    return states


def _last_traced(trace: Optional[RankTrace], ev: Optional[RankEvidence] = None) -> Optional[dict]:
    """The rank's last world collective, or FSDP's last call on its mesh's own group where that came
    later (its number is then the group's: ``group`` names the group's ranks)."""
    library = None if ev is None else next(
        (c for c in reversed(ev.of(Collective)) if c.phase is not None and c.group is not None and c.units), None)
    world = trace.entries[-1] if trace is not None and trace.entries else None
    if library is not None and (world is None or library.t > world.t):
        return {"op": library.op, "n": library.n, "site": (library.site or [None])[0], "group": library.group}
    if world is None:
        return None
    return {"op": world.op or world.describe(), "n": world.n, "site": (world.site or [None])[0]}


def _divergence_detail(mismatch: Optional[Mismatch]) -> tuple[str, Optional[Location]]:
    if mismatch is None:
        return "", None
    present = mismatch.present
    location = Location.from_site(present[mismatch.culprit()].site)
    said: dict[str, list[int]] = {}
    for r, e in sorted(present.items()):
        said.setdefault(f"{_verb(e)} {_describe(e)}", []).append(r)
    if any(len(ranks) > 4 for ranks in said.values()):  # many ranks: each call said once, for all that made it
        parts = [f"{_some_ranks(ranks)} {what}" for what, ranks in said.items()]
    else:
        parts = [f"rank {r} {_verb(e)} {_describe(e)}" for r, e in sorted(present.items())]
    if mismatch.absent:
        parts.append(f"{_some_ranks(mismatch.absent)} never called collective #{mismatch.n}")
    return f"; first divergence at collective #{mismatch.n}{_on_group(mismatch)}: " + ", ".join(parts), location


def _on_group(mismatch: Mismatch) -> str:
    return f" of the subgroup of ranks {', '.join(map(str, mismatch.group))}" if mismatch.group else ""


def _hang_finding(evidence: Evidence, stop: StopSnapshot) -> Finding:
    states = _rank_states(evidence, stop)
    waiting = sorted(int(r) for r, s in states.items() if s["state"] == "waiting")
    exited = sorted(int(r) for r, s in states.items() if s["state"] == "exited")
    others = sorted(int(r) for r, s in states.items() if s["state"] in ("busy", "computing"))
    # Members of a subgroup that disagree on its collective: the cause, whatever the world group shows.
    mismatch = subgroup_mismatch(evidence) or facts.collectives.divergence(evidence)
    detail, location = _divergence_detail(mismatch)
    if location is None:
        for r in waiting + others:
            where = states[str(r)].get("where")
            if where:
                location = Location(file=where["file"], line=int(where["line"]))
                break
    said: dict[tuple, list[int]] = {}  # (verb, what) -> the ranks it is true of: one clause for many ranks
    for r in waiting + others:
        state = states[str(r)]
        where = state.get("where")
        if state["state"] == "computing" and not state["stack"] and state.get("last_collective"):
            said.setdefault(("is", f"not inside a collective: {_stuck_after(state['last_collective'])}"), []).append(r)
            continue
        verb = ("waits", "wait") if state["state"] == "waiting" else (f"is {state['state']}", f"are {state['state']}")
        what = f"in {state.get('waiting_in') or 'its own code'}" \
            + (f" at {where['file'].rsplit('/', 1)[-1]}:{where['line']} ({where['function']})" if where else "")
        said.setdefault((verb, what), []).append(r)
    several = _several_hosts(evidence)  # then a rank is named with its host

    def on(ranks: list[int]) -> str:
        hosts = {states[str(r)].get("host") for r in ranks}
        return f" on {hosts.pop()}" if several and len(hosts) == 1 and None not in hosts else ""

    if any(len(ranks) > 4 for ranks in said.values()):  # many ranks: each thing said once, for all it is true of
        lines = [f"{_some_ranks(ranks)}{on(ranks)} {_verb_for(verb, ranks)} {what}"
                 for (verb, what), ranks in said.items()]
    else:
        clause = {r: (verb, what) for (verb, what), ranks in said.items() for r in ranks}
        lines = [f"rank {r}{on([r])} {_verb_for(clause[r][0], [r])} {clause[r][1]}" for r in waiting + others]
    never = sorted(int(r) for r, s in states.items() if s["state"] == "never started")
    tail = (f"; {fmt_ranks(exited)} had already exited" if exited else "") + \
        (f"; {fmt_ranks(never)} never started" if never else "") + _no_dump(evidence, states, waiting)
    if stop.reason == "no-progress":
        return Finding(
            check=ID, severity="warning", ranks=tuple(sorted(int(r) for r in states)), location=location,
            message=(f"no rank made progress for {max((s.get('stalled_s') or 0) for s in states.values()):.0f}s "
                     f"{'when the ranks dumped' if evidence.post_mortem else 'and the job was stopped'}: "
                     f"{'; '.join(lines) or 'no rank answered'}{tail}; not every rank waits "
                     f"in a collective, so this is not proven to be a hang{detail}"),
            fix=("If a rank was legitimately busy (a large checkpoint, slow storage), raise --hang-timeout; otherwise "
                 "the stacks show where each rank was stuck."),
            evidence=NoProgress(threshold_s=stop.threshold_s, ranks=states,
                                sequence=None if mismatch is None else mismatch.n, group=_group(mismatch)))
    timed_out = timed_out_ranks(stop) if evidence.post_mortem and others else []
    if timed_out:  # the watchdog's dumps: the others' collective timed out while these ranks were elsewhere
        return _never_arrived_finding(evidence, stop, states, timed_out, others, mismatch,
                                      f"{'; '.join(lines)}{tail}{detail}", location)
    message = f"the job hung: {'; '.join(lines) or 'no rank made progress'}{tail}{detail}"
    center = _center(evidence, mismatch)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(int(r) for r in states)), location=location, message=message,
        fix=("Make every rank call the same collectives in the same order: move collectives out of rank-specific "
             "branches (e.g. `if rank == 0:`), or broadcast the decision (early stop, skip) so all ranks take it."),
        evidence=Hung(threshold_s=stop.threshold_s, ranks=states,
                      first_divergence=None if mismatch is None or mismatch.group else mismatch.n,
                      sequence=None if mismatch is None else mismatch.n, group=_group(mismatch),
                      culprit_phase=None if mismatch is None else mismatch.present[mismatch.culprit()].phase,
                      timeline=_timeline(facts.collectives.world_traces(evidence), center)),
    )


def _never_arrived_finding(evidence: Evidence, stop: StopSnapshot, states: dict[str, dict], timed_out: list[int],
                           stuck: list[int], mismatch: Optional[Mismatch], said: str,
                           location: Optional[Location]) -> Finding:
    """A post-mortem whose dumps the watchdog wrote when a collective timed out, while ``stuck`` were
    in no collective: they never arrived, and the job hung on them. They are the finding, at the
    line their dumps last show them (a rank-only collective the waiting ranks made stays the cause)."""
    if mismatch is None or not mismatch.only_some_ranks(mismatch.present[mismatch.culprit()]):
        location = _last_seen(states, stuck) or location
    timeout = stop.threshold_s
    message = (f"the job hung: {_some_ranks(stuck)} never reached the collective {_some_ranks(timed_out)} "
               f"{'was' if len(timed_out) == 1 else 'were'} waiting in, which timed out after {timeout:g}s, and the "
               f"watchdog dumped every rank: {said}")
    return Finding(
        check=ID, severity="error", ranks=tuple(stuck), location=location, message=message,
        fix=(f"Find why {_some_ranks(stuck)} stayed in {'its' if len(stuck) == 1 else 'their'} own code after "
             "the last collective shown: a wait only some ranks run (a file, a lock, an input that never comes), a "
             "loop that never ends, or work far slower than on the other ranks. If that work is legitimately long "
             "(a checkpoint, an evaluation on one rank), make every rank wait for it in a collective with a longer "
             "timeout (init_process_group(timeout=...), or a barrier with one)."),
        evidence=Hung(threshold_s=timeout, timeout_s=timeout, ranks=states, culprit=stuck[0], called_by=timed_out,
                      never_called_by=stuck,
                      first_divergence=None if mismatch is None or mismatch.group else mismatch.n,
                      sequence=None if mismatch is None else mismatch.n, group=_group(mismatch),
                      culprit_phase=None if mismatch is None else mismatch.present[mismatch.culprit()].phase,
                      timeline=_timeline(facts.collectives.world_traces(evidence), _center(evidence, mismatch))),
    )


def _group(mismatch: Optional[Mismatch]) -> Optional[list[int]]:
    """The subgroup whose members disagree, or None (the world group, or no divergence found)."""
    return None if mismatch is None or mismatch.group is None else list(mismatch.group)


def _center(evidence: Evidence, mismatch: Optional[Mismatch]) -> int:
    """The world collective a hang's timeline is drawn around: the first divergence, else the last."""
    if mismatch is not None and mismatch.group is None:
        return mismatch.n
    return max((t.numbered_to for t in facts.collectives.world_traces(evidence).values()), default=0)


def _last_seen(states: dict[str, dict], ranks: list[int]) -> Optional[Location]:
    """Where the first of ``ranks`` was last seen: its stack's own line, else its last collective's."""
    for r in ranks:
        state = states[str(r)]
        site = state.get("where") or (state.get("last_collective") or {}).get("site") or {}
        if site.get("file") and site.get("line"):
            return Location(file=site["file"], line=int(site["line"]))
    return None


def _some_ranks(ranks: list[int]) -> str:
    """"rank 3", "ranks 0, 1" or, for many, "ranks 0-516, 518-1023"."""
    ranks = sorted(ranks)
    if len(ranks) <= 4:
        return fmt_ranks(ranks)
    spans, start = [], ranks[0]
    for previous, current in zip(ranks, ranks[1:] + [None]):
        if current != previous + 1 if current is not None else True:
            spans.append(f"{start}-{previous}" if previous > start else str(start))
            start = current
    return "ranks " + ", ".join(spans)


def _verb_for(verb, ranks: list[int]) -> str:
    if isinstance(verb, str):
        return verb if len(ranks) == 1 else {"is": "are"}.get(verb, verb)
    return verb[0] if len(ranks) == 1 else verb[1]


def _stuck_after(last: dict) -> str:
    """A rank no collective holds, seen only through its last collective (a flight recorder dump
    holds no stack of the moment it was written)."""
    site = last.get("site") or {}
    where = f"{site['file'].rsplit('/', 1)[-1]}:{site['line']}" if site.get("file") else "its last collective"
    function = f" ({site['function']})" if site.get("function") else ""
    return f"stuck in its own code after {where}{function}, its last collective (#{last.get('n')} {last.get('op')})"


def _no_dump(evidence: Evidence, states: dict[str, dict], waiting: list[int]) -> str:
    """Ranks that left no flight recorder dump, and what their peers show about them."""
    missing = sorted(int(r) for r, s in states.items() if s["state"] == "no dump")
    if not missing:
        return ""
    traces = facts.collectives.world_traces(evidence)
    ends = {traces[r].numbered_to for r in waiting if r in traces}
    who = _some_ranks(missing)
    if len(ends) == 1 and waiting and len(waiting) == len(states) - len(missing):
        return (f"; {who} left no dump: every other rank waits in collective #{ends.pop()}, which cannot complete "
                f"without {'it' if len(missing) == 1 else 'them'}")
    return f"; {who} left no dump"


def _timeline(traces: dict[int, RankTrace], center: int, before: int = 4) -> dict[str, dict[str, str]]:
    """Each rank's world collectives around collective #center: {rank: {n: "op at file:line"}}."""
    lo, hi = max(1, center - before), center + 1
    return {str(rank): {str(e.n): _describe(e) for e in trace.entries if lo <= e.n <= hi}
            for rank, trace in sorted(traces.items())}


def _orphaned_collective(evidence: Evidence) -> Optional[Finding]:
    """A rank died in a collective its peers never called: gloo aborts on the mismatched partner
    call, or raises "Connection closed by peer" once the peers' processes end."""
    mismatch = facts.collectives.divergence(evidence)
    if mismatch is None or not mismatch.absent:
        return None
    present = mismatch.present
    failures = facts.failures.rank_failures(evidence)
    failed_in_it = [f for f in failures if f.rank in present and f.seq >= mismatch.n]
    aborted = [f for f in failures if f.rank in mismatch.absent and _aborted_by_mismatch(f)]
    stopped = _stopped_in_it(evidence, mismatch, failures)
    if not failed_in_it and not aborted and not stopped:
        return None
    culprit = mismatch.culprit()
    hows = [_how_it_failed(f) for f in aborted + failed_in_it]
    if stopped:
        verb = "was" if len(stopped) == 1 else "were"
        hows.append(f"{fmt_ranks(stopped)} {verb} stopped (SIGTERM) as the job failed")
    how = "; ".join(hows)
    evidence_out = Orphaned(sequence=mismatch.n, called_by=sorted(present), never_called_by=mismatch.absent,
                            site=present[culprit].site, culprit_phase=present[culprit].phase)
    fix = ("Call every collective on every rank: move it out of the rank-specific branch, or broadcast the "
           "decision so all ranks take it.")
    message = (f"{fmt_ranks(present)} {_verb(present[culprit])} {_describe(present[culprit])} (collective "
               f"#{mismatch.n}) that {fmt_ranks(mismatch.absent)} never {_verb(present[culprit])}; then {how[:400]}")
    rank_only = _rank_only(mismatch, facts.collectives.world_traces(evidence))
    failed_elsewhere = [f for f in failures if rank_only and f.rank in rank_only.others and f not in aborted]
    if rank_only is not None and not failed_elsewhere:  # the others' only failure is gloo's abort on the mismatch
        met = (f"so its collective #{mismatch.n} met a different collective on {fmt_ranks([f.rank for f in aborted])}"
               if aborted else f"and collective #{mismatch.n} had no partner on {fmt_ranks(mismatch.absent)}")
        message = (f"{rank_only.ran} that {fmt_ranks(rank_only.others)} never ran: {_RANK_ONLY_WHY[rank_only.phase]}, "
                   f"a collective the other ranks pair with their own, {met}; then {how[:400]}")
        fix = _RANK_ONLY_FIX[rank_only.phase]
        evidence_out = replace(evidence_out, rank_only=rank_only.phase, never_ran=rank_only.others,
                               collectives_from_line=rank_only.counts)
    return Finding(check=ID, severity="error", ranks=tuple(sorted(present) + mismatch.absent),
                   location=Location.from_site(present[culprit].site), message=message, fix=fix,
                   evidence=evidence_out)


def _stopped_in_it(evidence: Evidence, mismatch: Mismatch, failures: list[RankFailure]) -> list[int]:
    """Ranks that had called the collective and were stopped by their launcher's SIGTERM with no
    failure of their own, after a rank that never called it failed: torchrun stops the survivors as
    soon as one rank fails, often before a survivor's backend has noticed that its peer is gone
    (NCCL may never notice)."""
    if evidence.stopped_by_ddpdoctor:
        return []  # ddpdoctor's own stop (hang, --timeout, Ctrl-C) is told by the hang finding
    if not any(f.rank in mismatch.absent for f in failures):
        return []  # nobody failed first: a stop from outside (a scheduler's) reached every rank
    own = {f.rank for f in failures}
    return sorted({f.rank for f in evidence.failures
                   if f.signal == "SIGTERM" and f.rank in mismatch.present and f.rank not in own})


def _aborted_by_mismatch(failure: RankFailure) -> bool:
    """The backend aborted this rank because a peer's collective did not match its own (gloo's size
    check): the rank was in a collective, paired with something else."""
    return failure.decoded is not None and failure.decoded.code == COLLECTIVE_MISMATCH


def _how_it_failed(failure: RankFailure) -> str:
    if _aborted_by_mismatch(failure):
        assert failure.decoded is not None
        killed = f" ({failure.signal})" if failure.signal else ""
        return f"gloo aborted rank {failure.rank}{killed}: {failure.decoded.detail or failure.headline}"
    if failure.signal:
        return f"rank {failure.rank} was killed by {failure.signal}"
    return f"rank {failure.rank} failed with {failure.headline or 'exit code ' + str(failure.code)}"


_RANK_ONLY_WHAT = {  # (one, several): what a rank ran that its peers did not
    "ddp-forward": ("a forward through the DDP wrapper", "forwards through the DDP wrapper"),
    "ddp-backward": ("a backward pass through DDP", "backward passes through DDP"),
    "ddp-init": ("a DDP constructor", "DDP constructors"),
}
_RANK_ONLY_WHY = {
    "ddp-forward": "each broadcasts DDP's buffers",
    "ddp-backward": "each all-reduces the gradients",
    "ddp-init": "it broadcasts the parameters",
}
_RANK_ONLY_FIX = {
    "ddp-forward": ("Run this forward on every rank, or on the one rank call the wrapped module itself "
                    "(`model.module(x)` under `torch.no_grad()`), which issues no collective: a forward through "
                    "the DDP wrapper broadcasts its buffers (and, with gradients on, prepares the gradient "
                    "all-reduce), and every rank must take part."),
    "ddp-backward": ("Run the backward pass through DDP on every rank, the same number of times, or wrap the "
                     "rank-specific part in `model.no_sync()`."),
    "ddp-init": "Construct DistributedDataParallel on every rank, in the same order.",
}


@dataclass(frozen=True)
class _RankOnly:
    """DDP's own collectives from a line (a forward, backward or constructor through the wrapper)
    that some ranks ran and the others never did."""

    phase: str
    ran: str  # "rank 0 ran 2 forwards through the DDP wrapper at train.py:39"
    others: list[int]
    counts: dict[str, int]  # rank -> collectives it issued from that line


def _rank_only(mismatch: Mismatch, traces: dict[int, RankTrace]) -> Optional[_RankOnly]:
    """The culprit's collective is DDP's own, from a line the other ranks issued no collective from."""
    culprit = mismatch.culprit()
    entry = mismatch.present[culprit]
    others = [r for r in sorted(mismatch.calls) if mismatch.counts.get(r, {}).get(entry.line_key(), 0) == 0]
    if not (entry.internal and others and entry.phase in _RANK_ONLY_WHAT):
        return None
    key = entry.line_key()
    counts = {str(r): mismatch.counts.get(r, {}).get(key, 0) for r in sorted(mismatch.calls)}
    times = len({id(e.event) for e in traces[culprit].entries if e.line_key() == key})
    one, several = _RANK_ONLY_WHAT[entry.phase]
    what = one if times == 1 else f"{times} {several}"
    return _RankOnly(phase=entry.phase, others=others,
                     ran=f"rank {culprit} ran {what} at {short_site(Location.from_site(entry.site))}",
                     counts=counts)


def _mismatch_finding(mismatch: Mismatch, traces: dict[int, RankTrace]) -> Finding:
    present = mismatch.present
    culprit = mismatch.culprit()
    entry = present[culprit]
    at_n = ", ".join(f"rank {r} {_verb(e)} {_describe(e)}" for r, e in sorted(present.items()))
    others = [r for r in sorted(mismatch.calls) if mismatch.counts.get(r, {}).get(entry.line_key(), 0) == 0]
    evidence = Mismatched(sequence=mismatch.n, culprit=culprit, culprit_phase=entry.phase,
                          group=list(mismatch.group) if mismatch.group else None,
                          calls={str(r): {"op": e.op, "phase": e.phase, "tensors": e.tensors, "site": e.site}
                                 for r, e in sorted(present.items())})
    fix = "Call the same collective with tensors of the same shape and dtype on every rank."
    rank_only = _rank_only(mismatch, traces)
    if rank_only is not None:
        message = (f"{rank_only.ran} that {fmt_ranks(rank_only.others)} never ran: {_RANK_ONLY_WHY[rank_only.phase]}, "
                   f"a collective the other ranks pair with their own, so from collective #{mismatch.n} on every "
                   f"collective is paired with a different one ({at_n})")
        fix = _RANK_ONLY_FIX[rank_only.phase]
        evidence = replace(evidence, rank_only=rank_only.phase, never_ran=rank_only.others,
                           collectives_from_line=rank_only.counts)
    else:
        message = f"collective #{mismatch.n}{_on_group(mismatch)} differs across ranks: {at_n}"
        if others:
            fix = ("Call every collective on every rank, in the same order: move it out of the rank-specific branch, "
                   "or broadcast the decision so all ranks take it.")
    return Finding(check=ID, severity="error", ranks=tuple(sorted(mismatch.calls)),
                   location=Location.from_site(entry.site), message=message, fix=fix, evidence=evidence)


def _stall_finding(evidence: Evidence) -> Optional[Finding]:
    """The longest stall that resolved by itself: worth knowing, not a problem."""
    stalls = evidence.observations.stalls
    if not stalls:
        return None
    stall = max(stalls, key=lambda s: max((r.stalled_s or 0) for r in s.ranks.values()))
    seconds = max((r.stalled_s or 0) for r in stall.ranks.values())
    busy = [f"rank {r} {s.state} in {s.waiting_in or 'its own code'}" for r, s in sorted(stall.ranks.items())
            if s.state in ("busy", "computing")]
    traces = facts.collectives.world_traces(evidence)
    return Finding(check=ID, severity="info", ranks=tuple(sorted(stall.ranks)), location=None,
                   message=f"no rank made progress for {seconds:.0f}s while {'; '.join(busy) or 'ranks were busy'}; "
                           "the job then went on (not a hang)",
                   fix="Nothing to do; a long stall in one rank makes the others wait, which costs time.",
                   evidence=Stalled(ranks={str(r): _stalled_state(s, traces.get(r))
                                           for r, s in sorted(stall.ranks.items())}))


def _stalled_state(state: RankState, trace: Optional[RankTrace]) -> dict[str, Any]:
    """A rank during a stall that resolved, drawn as a stopped rank is: its last collective is the one
    its heartbeat counted then (the trace goes on past the stall), named as the trace has it, and its
    line in the script."""
    beat = state.heartbeat
    last = beat.last_collective if beat else None
    entry = trace.by_n.get(last.get("n")) if trace is not None and isinstance(last, dict) else None
    if entry is not None:
        last = {"op": entry.op or entry.describe(), "n": entry.n, "site": (entry.site or [None])[0]}
    user = [f for f in state.stack if f.get("user")]
    return {"state": state.state, "waiting_in": state.waiting_in, "stalled_s": state.stalled_s,
            "last_collective": last, "where": user[-1] if user else None}


def analyze(evidence: Evidence) -> CheckResult:
    stop = evidence.stop
    if stop is not None and stop.reason in ("hang", "no-progress"):
        finding = _hang_finding(evidence, stop)
        verb = "job hung" if stop.reason == "hang" else "no progress"
        return CheckResult(findings=[finding], summary=f"{verb} ({_some_ranks(list(finding.ranks))})")
    if evidence.world_size >= 2 and evidence.post_mortem and not facts.ddp.has_process_group(evidence):
        return CheckResult(summary="no flight recorder dump: the collectives are unknown", applicable=False)
    if evidence.world_size < 2 or not facts.ddp.has_process_group(evidence):
        return CheckResult(summary="no process group", applicable=False)
    traces = facts.collectives.world_traces(evidence)
    library_world, library_groups = _library_calls(evidence, traces)
    total = sum(len(t.entries) for t in traces.values()) + library_groups
    mismatch = collective_mismatch(evidence) or subgroup_mismatch(evidence)
    if mismatch is not None:
        return CheckResult(findings=[_mismatch_finding(mismatch, traces)],
                           summary=f"collective #{mismatch.n} mismatched")
    orphan = _orphaned_collective(evidence)
    if orphan is not None:
        return CheckResult(findings=[orphan], summary="a collective had no partner")
    stall = _stall_finding(evidence)
    fsdp = library_world + library_groups
    of_them = f" ({fsdp} of them FSDP's)" if fsdp else ""
    return CheckResult(findings=[stall] if stall else [], summary=f"{total} collectives matched across ranks{of_them}")


def _library_calls(evidence: Evidence, traces: dict[int, RankTrace]) -> tuple[int, int]:
    """(FSDP's traced calls on the world group, on subgroups), summed over the ranks: the summary counts
    FSDP's collectives wherever its mesh put them (a gloo job under device simulation gets a group of
    its own over every rank, as DeviceMesh gives a gloo job beside GPUs)."""
    world = sum(1 for t in traces.values() for e in t.entries if not e.internal and e.phase != "call")
    missing = set(evidence.observations.missing_ranks)
    groups = sum(1 for rank, ev in evidence.ranks.items() if rank not in missing for c in ev.of(Collective)
                 if c.phase is not None and c.group is not None and c.units)
    return world, groups


CHECK = Check(id=ID, title="collectives matched, no hang", analyze=analyze, docs=DOCS, order=60,
              probes=('collectives', 'watchdog', 'flight-recorder', 'flight-recorder-missing'),
              evidence=(NoProgress, Hung, Orphaned, Mismatched, Stalled), explains=EXPLAINS,
              sources=frozenset({RUN, POSTMORTEM}))
