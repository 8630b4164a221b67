"""rank-failure: a rank raised, exited non-zero or was killed; find the root cause among the ranks."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.check_api import Check, CheckResult, Finding, Location
from ddpdoctor.evidence import Evidence

from ._common import fmt_ranks

ID = "rank-failure"

# Errors a rank raises because a peer died: symptoms, not causes.
SECONDARY_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
    "NCCL communicator was aborted", "Socket Timeout", "timed out", "DistBackendError",
    "DistNetworkError", "Connection refused", "process group has been destroyed",
)

DOCS = """\
## What it does
When a rank raises an exception, calls `sys.exit` with a non-zero code, or dies by a signal, this
check names that rank, the exception or exit code or signal, the line in your script and the last
optimizer step it completed. It separates the root cause from the secondary errors of its peers
("Connection closed by peer", collective timeouts), which are what torchrun usually shows first.

## Why it matters
In a DDP job one failing rank makes every other rank fail in a collective moments later. The logs
then hold N tracebacks, most of them about sockets, and the real one is easy to miss.

## Example
```python
if rank == 1 and step == 3:
    raise ValueError("bad batch")       # rank 0 then fails in all_reduce: "Connection closed by peer"
```

## Use instead
Fix the root cause reported here; the peers' errors go away with it.
"""


def _is_secondary(message: str) -> bool:
    return any(marker.lower() in message.lower() for marker in SECONDARY_MARKERS)


def _last_step(evidence: Evidence, rank: int) -> Optional[int]:
    ev = evidence.ranks.get(rank)
    return max((e.get("step", 0) for e in ev.events), default=None) if ev else None


def _unfinished(evidence: Evidence) -> Optional[Finding]:
    """The job did not end by itself: --timeout expired or ddpdoctor was interrupted."""
    snapshot = evidence.hang or {}
    where = {r: {"steps": b.get("steps"), "doing": b.get("activity")} for r, b in snapshot.get("heartbeats", {}).items()}
    steps = ", ".join(f"rank {r} at step {w['steps']}" for r, w in sorted(where.items(), key=lambda kv: int(kv[0])))
    if evidence.outcome == "timeout":
        return Finding(
            check=ID, severity="error", ranks=tuple(sorted(evidence.ranks)), location=None,
            message=f"the job did not finish within --timeout {evidence.timeout_s or 0:g}s and was stopped ({steps or 'no rank reported'})",
            fix="Raise --timeout if the job is just slow; if ranks stalled, run with --hang-timeout to see where they wait.",
            evidence={"ranks": where, "timeout_s": evidence.timeout_s})
    if evidence.interrupted:
        return Finding(
            check=ID, severity="warning", ranks=tuple(sorted(evidence.ranks)), location=None,
            message=f"ddpdoctor was interrupted ({snapshot.get('signal', 'signal')}) before the job finished; "
                    f"the report covers the evidence gathered until then ({steps or 'no rank reported'})",
            fix="Let the job run to the end for a complete diagnosis.",
            evidence={"ranks": where, "signal": snapshot.get("signal")})
    return None


def analyze(evidence: Evidence) -> CheckResult:
    candidates: list[dict] = []
    for rank, event in evidence.events("exception"):
        candidates.append({"rank": rank, "t": event["t"], "kind": "exception", "event": event,
                           "secondary": _is_secondary(event.get("message", "")) or event.get("type") == "KeyboardInterrupt"})
    for rank, event in evidence.events("sys_exit"):
        candidates.append({"rank": rank, "t": event["t"], "kind": "exit", "event": event, "secondary": False})
    for event in evidence.unranked:
        if event.get("kind") == "exception":
            candidates.append({"rank": None, "t": event["t"], "kind": "exception", "event": event,
                               "secondary": _is_secondary(event.get("message", ""))})
    explained = {c["rank"] for c in candidates}
    if not evidence.stopped_by_ddpdoctor:
        for failure in evidence.failures:
            rank = failure.get("rank")
            # torchrun stops the survivors with SIGTERM after the first failure: not a cause.
            if rank in explained or failure.get("signal") == "SIGTERM":
                continue
            if not failure.get("signal") and not failure.get("exitcode"):
                continue
            ev = evidence.ranks.get(rank)
            t = max((e["t"] for e in ev.events), default=0.0) if ev else 0.0
            candidates.append({"rank": rank, "t": t, "kind": "signal" if failure.get("signal") else "exitcode",
                               "event": failure, "secondary": False})
    if not candidates:
        unfinished = _unfinished(evidence)
        if unfinished is not None:
            return CheckResult(findings=[unfinished], summary=unfinished.message.split(":")[0])
        return CheckResult(summary="no rank failed")
    primary = sorted([c for c in candidates if not c["secondary"]] or candidates, key=lambda c: c["t"])[0]
    secondary = [c for c in candidates if c is not primary]
    rank = primary["rank"]
    event = primary["event"]
    who = f"rank {rank}" if rank is not None else "the launcher process"
    step = _last_step(evidence, rank) if rank is not None else None
    location = Location.from_site(event.get("location"))
    if primary["kind"] == "exception":
        message = f"{who} raised {event.get('type')}: {event.get('message', '').strip().splitlines()[0][:300] if event.get('message') else ''}"
        fix = "Fix this exception; the errors of the other ranks follow from it."
    elif primary["kind"] == "exit":
        message = f"{who} called sys.exit({event.get('code')})"
        fix = "Exit on every rank together (decide collectively, e.g. broadcast the decision), or fix the condition that exits."
    elif primary["kind"] == "signal":
        message = f"{who} was killed by {event.get('signal')}"
        fix = ("Find what killed it: the kernel OOM killer (dmesg), a cluster scheduler, or a crash in native code. "
               "Each rank needs its own share of host memory.")
    else:
        message = f"{who} exited with code {event.get('exitcode')}"
        fix = "Look at this rank's output above for the cause."
    if step is not None:
        message += f" after optimizer step {step}"
    evidence_out = {
        "rank": rank,
        "kind": primary["kind"],
        "last_step": step,
        **({"exception": event.get("type"), "message": event.get("message"), "frames": event.get("frames")}
           if primary["kind"] == "exception" else {}),
        **({"exitcode": event.get("exitcode", event.get("code")), "signal": event.get("signal")}
           if primary["kind"] != "exception" else {}),
        "secondary": [{"rank": c["rank"], "kind": c["kind"],
                       "summary": (c["event"].get("type", "") + ": " + c["event"].get("message", "")[:200]).strip(": ")
                       if c["kind"] == "exception" else str(c["event"].get("signal") or c["event"].get("code"))}
                      for c in secondary],
    }
    finding = Finding(check=ID, severity="error", message=message, fix=fix,
                      ranks=(rank,) if rank is not None else (), location=location, evidence=evidence_out)
    others = sorted({c["rank"] for c in secondary if c["rank"] is not None and c["rank"] != rank})
    summary = f"{who} failed first" + (f"; {fmt_ranks(others)} failed after it" if others else "")
    return CheckResult(findings=[finding], summary=summary)


CHECK = Check(id=ID, title="every rank finished", analyze=analyze, docs=DOCS)
