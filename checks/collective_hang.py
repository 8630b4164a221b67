"""collective-hang: ranks meet in the same collectives in the same order; hangs are explained."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.analysis.api import Check, CheckResult, Finding, Location
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts import Mismatch
from ddpdoctor.schema.events import Collective
from ddpdoctor.schema.observations import StopSnapshot

from ._common import fmt_ranks, short_site

ID = "collective-hang"

DOCS = """\
## What it does
Traces every torch.distributed collective each rank calls (op, sequence number, tensor shapes and
dtypes, call site) at no extra communication cost, and a watchdog thread in every rank reports
progress. It reports:

- **a hang**: a rank without progress for `--hang-timeout` seconds (default max(30 s, 10x the
  slowest step)). ddpdoctor collects every rank's Python stack, even while it is blocked in C++,
  stops the job, and says where each rank waits (op, file:line, stack), which ranks never arrived
  or already exited, and the first collective at which the ranks' traces differ;
- **a mismatch without a hang**: at the same sequence number ranks called different collectives or
  passed tensors of different shape or dtype (which gloo and NCCL may silently mis-reduce, or
  raise about at once, as gloo does for an all_gather whose size differs by rank).

A rank busy in code that is not communication (a large `torch.save`, a DataLoader waiting on
slow storage, its own computation) is not hung: the job counts as hung only when every rank still
running waits for its peers. A stall that is not provably a hang is reported as "no progress"
with the stacks, and stops the job only after ten times the hang timeout.

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


_INPUT_LAST = {"all_gather", "all_gather_into_tensor"}


def _describe(event: Optional[Collective]) -> str:
    if event is None:
        return "nothing (no collective with this number)"
    tensors = event.tensors or []
    shown = tensors[-1] if event.op in _INPUT_LAST and tensors else (tensors[0] if tensors else None)
    shape = f" of {shown[1]}{shown[0]}" if shown else ""
    return f"{event.op}{shape} at {short_site(Location.from_site(event.site))}"


def _several_hosts(evidence: Evidence) -> bool:
    """The ranks ran on more than one host: a rank is then named with its host."""
    return len({ev.host for ev in evidence.ranks.values() if ev.host}) > 1


def _rank_states(evidence: Evidence, stop: StopSnapshot) -> dict[str, dict]:
    traces = evidence.facts.world_collectives
    states: dict[str, dict] = {}
    for rank, state in sorted(stop.ranks.items()):
        if state.state == "never started":
            states[str(rank)] = {"state": "never started"}
            continue
        beat = state.heartbeat
        user = [f for f in state.stack if f.get("user")]
        last = (beat.last_collective if beat else None) or _last_traced(traces.get(rank, []))
        ev = evidence.ranks.get(rank)
        states[str(rank)] = {
            "host": (ev.host if ev else None) or (beat.host if beat else None) or None,
            "state": state.state,
            "waiting_in": state.waiting_in,
            "activity": beat.activity if beat else None,
            "stalled_s": state.stalled_s,
            "steps": beat.steps if beat else None,
            "last_collective": last,
            "where": user[-1] if user else None,
            "stack": [f"{f['file']}:{f['line']} in {f['function']}" for f in state.stack[-8:]],
        }
    return states


def _last_traced(trace: list[Collective]) -> Optional[dict]:
    if not trace:
        return None
    return {"op": trace[-1].op, "n": trace[-1].n, "site": (trace[-1].site or [None])[0]}


def _divergence_detail(mismatch: Optional[Mismatch]) -> tuple[str, Optional[Location]]:
    if mismatch is None:
        return "", None
    present = mismatch.present
    location = Location.from_site(present[mismatch.culprit()].site)
    parts = [f"rank {r} called {_describe(e)}" for r, e in sorted(present.items())]
    if mismatch.absent:
        parts.append(f"{fmt_ranks(mismatch.absent)} never called collective #{mismatch.n}")
    return f"; first divergence at collective #{mismatch.n}: " + ", ".join(parts), location


def _hang_finding(evidence: Evidence, stop: StopSnapshot) -> Finding:
    states = _rank_states(evidence, stop)
    waiting = sorted(int(r) for r, s in states.items() if s["state"] == "waiting")
    exited = sorted(int(r) for r, s in states.items() if s["state"] == "exited")
    others = sorted(int(r) for r, s in states.items() if s["state"] in ("busy", "computing"))
    mismatch = evidence.facts.collective_divergence
    detail, location = _divergence_detail(mismatch)
    if location is None:
        for r in waiting + others:
            where = states[str(r)].get("where")
            if where:
                location = Location(file=where["file"], line=int(where["line"]))
                break
    lines = []
    for r in waiting + others:
        state = states[str(r)]
        where = state.get("where")
        verb = "waits in" if state["state"] == "waiting" else f"is {state['state']} in"
        on = f" on {state['host']}" if state.get("host") and _several_hosts(evidence) else ""
        lines.append(f"rank {r}{on} {verb} {state.get('waiting_in') or 'its own code'}"
                     + (f" at {where['file'].rsplit('/', 1)[-1]}:{where['line']} ({where['function']})" if where else ""))
    never = sorted(int(r) for r, s in states.items() if s["state"] == "never started")
    tail = (f"; {fmt_ranks(exited)} had already exited" if exited else "") + \
        (f"; {fmt_ranks(never)} never started" if never else "")
    if stop.reason == "no-progress":
        return Finding(
            check=ID, severity="warning", ranks=tuple(sorted(int(r) for r in states)), location=location,
            message=(f"no rank made progress for {max((s.get('stalled_s') or 0) for s in states.values()):.0f}s "
                     f"and the job was stopped: {'; '.join(lines) or 'no rank answered'}{tail}; not every rank waits "
                     "in a collective, so this is not proven to be a hang"),
            fix=("If a rank was legitimately busy (a large checkpoint, slow storage), raise --hang-timeout; otherwise "
                 "the stacks show where each rank was stuck."),
            evidence={"kind": "no-progress", "threshold_s": stop.threshold_s, "ranks": states})
    message = f"the job hung: {'; '.join(lines) or 'no rank made progress'}{tail}{detail}"
    center = mismatch.n if mismatch is not None else max((len(t) for t in evidence.facts.world_collectives.values()),
                                                          default=0)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(int(r) for r in states)), location=location, message=message,
        fix=("Make every rank call the same collectives in the same order: move collectives out of rank-specific "
             "branches (e.g. `if rank == 0:`), or broadcast the decision (early stop, skip) so all ranks take it."),
        evidence={"kind": "hang", "threshold_s": stop.threshold_s, "ranks": states,
                  "first_divergence": None if mismatch is None else mismatch.n,
                  "sequence": None if mismatch is None else mismatch.n,
                  "timeline": _timeline(evidence.facts.world_collectives, center)},
    )


def _timeline(traces: dict[int, list[Collective]], center: int, before: int = 4) -> dict[str, dict[str, str]]:
    """Each rank's world collectives around collective #center: {rank: {n: "op at file:line"}}."""
    lo, hi = max(1, center - before), center + 1
    return {str(rank): {str(e.n): f"{e.op} at {short_site(Location.from_site(e.site))}"
                        for e in trace if lo <= e.n <= hi}
            for rank, trace in sorted(traces.items())}


def _orphaned_collective(evidence: Evidence) -> Optional[Finding]:
    """A rank died in a collective its peers never called: gloo aborts on the mismatched partner
    call, or raises "Connection closed by peer" once the peers' processes end."""
    mismatch = evidence.facts.collective_divergence
    if mismatch is None or not mismatch.absent:
        return None
    present = mismatch.present
    failed_in_it = [f for f in evidence.facts.failures if f.rank in present and f.seq == mismatch.n]
    if not failed_in_it:
        return None
    culprit = mismatch.culprit()
    how = "; ".join(f"rank {f.rank} {'was killed by ' + f.signal if f.signal else 'failed with ' + (f.headline or 'exit code ' + str(f.code))}"
                    for f in failed_in_it)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(present) + mismatch.absent),
        location=Location.from_site(present[culprit].site),
        message=(f"{fmt_ranks(present)} called {_describe(present[culprit])} (collective #{mismatch.n}) that "
                 f"{fmt_ranks(mismatch.absent)} never called; then {how[:300]}"),
        fix=("Call every collective on every rank: move it out of the rank-specific branch, or broadcast the "
             "decision so all ranks take it."),
        evidence={"kind": "orphan", "sequence": mismatch.n, "called_by": sorted(present),
                  "never_called_by": mismatch.absent, "site": present[culprit].site},
    )


def _mismatch_finding(mismatch: Mismatch) -> Finding:
    present = mismatch.present
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(present)),
        location=Location.from_site(present[mismatch.culprit()].site),
        message=f"collective #{mismatch.n} differs across ranks: " + ", ".join(
            f"rank {r} called {_describe(e)}" for r, e in sorted(present.items())),
        fix="Call the same collective with tensors of the same shape and dtype on every rank.",
        evidence={"kind": "mismatch", "sequence": mismatch.n,
                  "calls": {str(r): {"op": e.op, "tensors": e.tensors, "site": e.site}
                            for r, e in sorted(present.items())}},
    )


def _stall_finding(evidence: Evidence) -> Optional[Finding]:
    """The longest stall that resolved by itself: worth knowing, not a problem."""
    stalls = evidence.observations.stalls
    if not stalls:
        return None
    stall = max(stalls, key=lambda s: max((r.stalled_s or 0) for r in s.ranks.values()))
    seconds = max((r.stalled_s or 0) for r in stall.ranks.values())
    busy = [f"rank {r} {s.state} in {s.waiting_in or 'its own code'}" for r, s in sorted(stall.ranks.items())
            if s.state in ("busy", "computing")]
    return Finding(check=ID, severity="info", ranks=tuple(sorted(stall.ranks)), location=None,
                   message=f"no rank made progress for {seconds:.0f}s while {'; '.join(busy) or 'ranks were busy'}; "
                           "the job then went on (not a hang)",
                   fix="Nothing to do; a long stall in one rank makes the others wait, which costs time.",
                   evidence={"kind": "stall", "ranks": {str(r): {"state": s.state, "waiting_in": s.waiting_in}
                                                        for r, s in sorted(stall.ranks.items())}})


def analyze(evidence: Evidence) -> CheckResult:
    stop = evidence.stop
    if stop is not None and stop.reason in ("hang", "no-progress"):
        finding = _hang_finding(evidence, stop)
        verb = "job hung" if stop.reason == "hang" else "no progress"
        return CheckResult(findings=[finding], summary=f"{verb} ({fmt_ranks(finding.ranks)})")
    if evidence.world_size < 2 or not evidence.facts.has_process_group:
        return CheckResult(summary="no process group", applicable=False)
    traces = evidence.facts.world_collectives
    total = sum(len(t) for t in traces.values())
    mismatch = evidence.facts.collective_mismatch
    if mismatch is not None:
        return CheckResult(findings=[_mismatch_finding(mismatch)], summary=f"collective #{mismatch.n} mismatched")
    orphan = _orphaned_collective(evidence)
    if orphan is not None:
        return CheckResult(findings=[orphan], summary="a collective had no partner")
    stall = _stall_finding(evidence)
    return CheckResult(findings=[stall] if stall else [], summary=f"{total} collectives matched across ranks")


CHECK = Check(id=ID, title="collectives matched, no hang", analyze=analyze, docs=DOCS)
