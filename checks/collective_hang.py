"""collective-hang: ranks meet in the same collectives in the same order; hangs are explained."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.check_api import Check, CheckResult, Finding, Location
from ddpdoctor.evidence import Evidence

from ._common import fmt_ranks, short_site

ID = "collective-hang"

POINT_TO_POINT = {"send", "recv", "isend", "irecv"}

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
  passed tensors of different shape or dtype (which gloo and NCCL may silently mis-reduce).

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


def _collectives(evidence: Evidence) -> dict[int, list[dict]]:
    return {rank: [e for e in ev.of("collective") if e.get("group") is None and e.get("op") not in POINT_TO_POINT]
            for rank, ev in evidence.ranks.items()}


def _signature(event: dict) -> tuple:
    tensors = event.get("tensors") or []
    return (event.get("op"), tuple(tuple(t[0]) + (t[1],) for t in tensors[:1]))


def _describe(event: Optional[dict]) -> str:
    if event is None:
        return "nothing (no collective with this number)"
    tensors = event.get("tensors") or []
    shape = f" of {tensors[0][1]}{tensors[0][0]}" if tensors else ""
    return f"{event.get('op')}{shape} at {short_site(Location.from_site(event.get('site')))}"


def first_mismatch(traces: dict[int, list[dict]], *, include_missing: bool) -> Optional[tuple[int, dict[int, Optional[dict]]]]:
    """First sequence index where ranks' collectives differ in op or first tensor's shape/dtype."""
    if len(traces) < 2:
        return None
    longest = max(len(t) for t in traces.values())
    shortest = min(len(t) for t in traces.values())
    for i in range(longest if include_missing else shortest):
        at = {r: (t[i] if i < len(t) else None) for r, t in traces.items()}
        signatures = {(_signature(e) if e else None) for e in at.values()}
        if len(signatures) > 1:
            return i + 1, at
    return None


def _waiting_in(activity: str, stack: list[dict]) -> str:
    """What a stalled rank waits in, from its traced activity or, for DDP's own collectives, its stack."""
    if activity.startswith("in "):
        return activity[3:]
    files = [f.get("file", "") for f in stack]
    if any("torch/autograd" in f for f in files):
        return "the backward pass (DDP's gradient all-reduce)"
    if any(f.endswith("torch/nn/parallel/distributed.py") for f in files):
        return "DDP's forward (buffer broadcast)"
    if any("torch/distributed" in f for f in files):
        return "a torch.distributed call"
    return activity or "an unknown place"


def _culprit(present: dict[int, dict]) -> int:
    """The rank whose call to point at: one made inside a rank-dependent branch (`if rank == 0:`),
    else the one that was made first."""
    return min(present, key=lambda r: (not present[r].get("rank_branch"), present[r].get("t", 0)))


def _rank_states(evidence: Evidence, traces: dict[int, list[dict]]) -> dict[str, dict]:
    hang = evidence.hang or {}
    states: dict[str, dict] = {}
    for key, beat in sorted(hang.get("heartbeats", {}).items(), key=lambda kv: int(kv[0])):
        rank = int(key)
        stack = (hang.get("stacks", {}).get(key) or {}).get("stack", [])
        user = [f for f in stack if f.get("user")]
        last = traces.get(rank, [])[-1:] or [None]
        state = "exited" if rank in hang.get("exited", []) else "waiting" if stack and not stack[-1].get("user") else "running"
        waiting_in = _waiting_in(beat.get("activity") or "", stack)
        states[key] = {
            "state": state,
            "activity": beat.get("activity"),
            "waiting_in": waiting_in,
            "stalled_s": hang.get("stall_s", {}).get(key),
            "steps": beat.get("steps"),
            "last_collective": None if last[0] is None else {"n": last[0].get("n"), "op": last[0].get("op"),
                                                             "site": (last[0].get("site") or [None])[0]},
            "where": user[-1] if user else None,
            "stack": [f"{f['file']}:{f['line']} in {f['function']}" for f in stack[-8:]],
        }
    for rank in hang.get("missing", []):
        states[str(rank)] = {"state": "never started"}
    return states


def _hang_finding(evidence: Evidence, traces: dict[int, list[dict]]) -> Finding:
    hang = evidence.hang or {}
    states = _rank_states(evidence, traces)
    waiting = sorted(int(r) for r, s in states.items() if s["state"] == "waiting")
    exited = sorted(int(r) for r, s in states.items() if s["state"] == "exited")
    mismatch = first_mismatch(traces, include_missing=True)
    location: Optional[Location] = None
    detail = ""
    if mismatch is not None:
        n, at = mismatch
        present = {r: e for r, e in at.items() if e is not None}
        absent = sorted(r for r, e in at.items() if e is None)
        first_rank = _culprit(present)
        location = Location.from_site(present[first_rank].get("site"))
        parts = [f"rank {r} called {_describe(e)}" for r, e in sorted(present.items())]
        if absent:
            parts.append(f"{fmt_ranks(absent)} never called collective #{n}")
        detail = f"; first divergence at collective #{n}: " + ", ".join(parts)
    if location is None:
        for r in waiting:
            where = states[str(r)].get("where")
            if where:
                location = Location(file=where["file"], line=int(where["line"]))
                break
    waits = []
    for r in waiting:
        s = states[str(r)]
        where = s.get("where")
        waits.append(f"rank {r} waits in {s['waiting_in']}"
                     + (f" at {where['file'].rsplit('/', 1)[-1]}:{where['line']} ({where['function']})" if where else ""))
    message = (f"the job hung: {'; '.join(waits) or 'no rank made progress'}"
               + (f"; {fmt_ranks(exited)} had already exited" if exited else "")
               + detail)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(int(r) for r in states)), location=location, message=message,
        fix=("Make every rank call the same collectives in the same order: move collectives out of rank-specific "
             "branches (e.g. `if rank == 0:`), or broadcast the decision (early stop, skip) so all ranks take it."),
        evidence={"threshold_s": hang.get("threshold_s"), "ranks": states,
                  "first_divergence": None if mismatch is None else mismatch[0]},
    )


def _orphaned_collective(evidence: Evidence, traces: dict[int, list[dict]]) -> Optional[Finding]:
    """A rank died in a collective its peers never called (they had exited): the hang that gloo
    turned into "Connection closed by peer" when the peers' processes ended."""
    mismatch = first_mismatch(traces, include_missing=True)
    if mismatch is None:
        return None
    n, at = mismatch
    present = {r: e for r, e in at.items() if e is not None}
    absent = sorted(r for r, e in at.items() if e is None)
    failed_in_it = {r for r, e in evidence.events("exception") if r in present and e.get("seq") == n}
    if not absent or not failed_in_it:
        return None
    culprit = _culprit(present)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(present) + absent),
        location=Location.from_site(present[culprit].get("site")),
        message=(f"{fmt_ranks(present)} called {_describe(present[culprit])} (collective #{n}) that "
                 f"{fmt_ranks(absent)} never called; it failed when the other ranks' processes ended"),
        fix=("Call every collective on every rank: move it out of the rank-specific branch, or broadcast the "
             "decision so all ranks take it."),
        evidence={"sequence": n, "called_by": sorted(present), "never_called_by": absent,
                  "site": present[culprit].get("site")},
    )


def analyze(evidence: Evidence) -> CheckResult:
    traces = _collectives(evidence)
    hang_reason = (evidence.hang or {}).get("reason")
    if evidence.outcome == "hung" and hang_reason == "hang":
        finding = _hang_finding(evidence, traces)
        return CheckResult(findings=[finding], summary=f"job hung ({fmt_ranks(finding.ranks)})")
    if evidence.world_size < 2 or not evidence.any("init_pg"):
        return CheckResult(summary="no process group", applicable=False)
    mismatch = first_mismatch(traces, include_missing=False)
    total = sum(len(t) for t in traces.values())
    if mismatch is None:
        orphan = _orphaned_collective(evidence, traces)
        if orphan is not None:
            return CheckResult(findings=[orphan], summary="a collective had no partner")
        return CheckResult(summary=f"{total} collectives matched across ranks")
    n, at = mismatch
    present = {r: e for r, e in at.items() if e is not None}
    first_rank = _culprit(present)
    finding = Finding(
        check=ID, severity="error", ranks=tuple(sorted(present)),
        location=Location.from_site(present[first_rank].get("site")),
        message=f"collective #{n} differs across ranks: " + ", ".join(
            f"rank {r} called {_describe(e)}" for r, e in sorted(present.items())),
        fix="Call the same collective with tensors of the same shape and dtype on every rank.",
        evidence={"sequence": n, "calls": {str(r): {"op": e.get("op"), "tensors": e.get("tensors"),
                                                    "site": e.get("site")} for r, e in sorted(present.items())}},
    )
    return CheckResult(findings=[finding], summary=f"collective #{n} mismatched")


CHECK = Check(id=ID, title="collectives matched, no hang", analyze=analyze, docs=DOCS)
