"""rank-failure: a rank raised, exited non-zero or was killed; find the root cause among the ranks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import (ENVIRONMENT, POSTMORTEM, RUN, Check, CheckResult, EvidenceRecord, Explains, Finding,
                                    Severity, evidence_field)
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.failures import RankFailure, is_reduction_error
from ddpdoctor.analysis.symptoms import CollectivesUnmatched, FailureKind, HangKind, RankFailed
from ddpdoctor.schema.findings import ABSENT

from ._common import fmt_ranks

ID = "rank-failure"

_DIGITS = re.compile(r"\d+")

DOCS = """\
## What it does
When a rank raises an exception, calls `sys.exit` with a non-zero code, or dies by a signal, this
check names that rank, the exception or exit code or signal, the line in your script and the last
optimizer step it completed. It separates the root cause from the secondary errors of its peers
("Connection closed by peer", collective timeouts), which are what torchrun usually shows first.

Every rank raising the same exception at the same line is one cause, reported once for all of
them. NCCL and CUDA errors are decoded into their cause (two ranks on one GPU, out of memory, a
device-side assert...), reading NCCL's "Last error" line and the rank's own output. A rank killed
by SIGABRT because gloo aborted it on a collective mismatch (its output: "Received data size
doesn't match expected size") says so; the collectives that diverged are then the cause
(collective-hang), and this failure is attached to that finding.

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


@dataclass(frozen=True)
class Failed(EvidenceRecord, RankFailed):
    """The first failure, and the ranks that failed the same way; the message says what happened."""

    rank: Optional[int] = evidence_field(hidden=True, keep_none=True)
    ranks: list[int] = evidence_field(hidden=True, default_factory=list)
    kind: str = evidence_field(hidden=True, default="")
    last_step: Optional[int] = evidence_field(label="last optimizer step", keep_none=True)
    seq: Optional[int] = evidence_field(hidden=True, keep_none=True)
    secondary_only: bool = evidence_field(hidden=True, default=False)
    reduction_error: bool = evidence_field(hidden=True, default=False)
    failed_ranks: list[int] = evidence_field(hidden=True, default_factory=list)
    exception: Optional[str] = evidence_field(hidden=True, default=ABSENT, keep_none=True)
    message: Optional[str] = evidence_field(hidden=True, default=ABSENT, keep_none=True)
    frames: Optional[list[dict[str, Any]]] = evidence_field(hidden=True, default=ABSENT, keep_none=True)
    exitcode: Optional[int] = evidence_field(label="exit code", default=ABSENT, keep_none=True)
    signal: Optional[str] = evidence_field(default=ABSENT, keep_none=True)
    decoded: Optional[dict[str, Any]] = evidence_field(hidden=True)  # {code, cause, detail}
    secondary: list[dict[str, Any]] = evidence_field(hidden=True, default_factory=list)

    @property
    def error_code(self) -> Optional[str]:
        return (self.decoded or {}).get("code")


@dataclass(frozen=True)
class TimedOut(EvidenceRecord, RankFailed):
    """--timeout stopped the job: where each rank was."""

    discriminator = {"kind": FailureKind.TIMEOUT.value}
    kind: str = evidence_field(hidden=True, default=FailureKind.TIMEOUT.value)
    ranks: dict[str, dict[str, Any]] = evidence_field(hidden=True, unit="rank-states", default_factory=dict)
    timeout_s: Optional[float] = evidence_field(label="timeout", unit="s", keep_none=True)


@dataclass(frozen=True)
class TeardownAbort(EvidenceRecord, RankFailed):
    """Ranks killed in torch's own teardown after the script finished."""

    discriminator = {"kind": FailureKind.TEARDOWN.value}
    kind: str = evidence_field(hidden=True, default=FailureKind.TEARDOWN.value)
    signals: dict[str, str] = evidence_field(default_factory=dict)


def _orphan_of_failed_ranks(symptom: Finding, cause: Finding) -> bool:
    """A collective that failed because the ranks that never called it had already crashed."""
    hang, failed = symptom.evidence, cause.evidence
    return (isinstance(hang, CollectivesUnmatched) and isinstance(failed, Failed) and hang.kind == HangKind.ORPHAN
            and bool(hang.never_called_by) and set(hang.never_called_by) <= set(failed.failed_ranks))


def _crashed_first(finding: Finding) -> bool:
    return (finding.severity == Severity.ERROR and isinstance(finding.evidence, Failed)
            and not finding.evidence.secondary_only)


EXPLAINS = (
    # A rank crashed first: its peers' failed collectives follow from it.
    Explains("a rank crashed", _orphan_of_failed_ranks, cause=_crashed_first, priority=120),
)


def _last_step(evidence: Evidence, rank: Optional[int]) -> Optional[int]:
    """The rank's last completed optimizer step; None when unknown (no event of the rank, or a
    post-mortem, whose files hold no step), which is not 0 ("before the first optimizer step")."""
    ev = evidence.ranks.get(rank) if rank is not None else None
    if ev is None or not evidence.counts_steps:
        return None
    return max((e.step for e in ev.events), default=None)


def _unfinished(evidence: Evidence) -> Optional[Finding]:
    """The job did not end by itself because --timeout expired. (A stop signal is no finding: the
    run's outcome is "interrupted" and ddpdoctor exits 128+signal.)"""
    stop = evidence.stop
    if stop is None or stop.reason != "timeout":
        return None
    where = {str(r): {"steps": s.heartbeat.steps if s.heartbeat else None, "doing": s.waiting_in or s.state}
             for r, s in sorted(stop.ranks.items())}
    steps = ", ".join(f"rank {r} at step {w['steps']}" for r, w in where.items() if w["steps"] is not None)
    return Finding(
        check=ID, severity="error", ranks=tuple(sorted(evidence.ranks)), location=None,
        message=f"the job did not finish within --timeout {evidence.observations.timeout_s or 0:g}s and was "
                f"stopped ({steps or 'no rank reported'})",
        fix=("Raise --timeout if the job is just slow; if ranks stalled, run with --hang-timeout to see where they "
             "wait."),
        evidence=TimedOut(ranks=where, timeout_s=evidence.observations.timeout_s))


def _same_cause(a: RankFailure, b: RankFailure) -> bool:
    if a.kind != b.kind or a.type != b.type:
        return False
    return a.location == b.location and _DIGITS.sub("#", a.headline) == _DIGITS.sub("#", b.headline)


def _describe(failure: RankFailure, who: str) -> tuple[str, str]:
    """(message, fix) for one failure."""
    if failure.kind == "exception":
        message = f"{who} raised {failure.headline}"
        fix = "Fix this exception; the errors of the other ranks follow from it."
        if failure.decoded is not None:
            message = f"{who} raised {failure.type}: {failure.decoded.cause}"
            if failure.decoded.detail:
                message += f" (NCCL: {failure.decoded.detail})" if "nccl" in failure.decoded.code else \
                    f" ({failure.decoded.detail})"
            fix = failure.decoded.fix
        return message, fix
    if failure.kind == "exit":
        return (f"{who} called sys.exit({failure.code})",
                "Exit on every rank together (decide collectively, e.g. broadcast the decision), or fix the "
                "condition that exits.")
    if failure.kind == "signal" and failure.decoded is not None:  # its own output says why it aborted
        detail = f" ({failure.decoded.detail})" if failure.decoded.detail else ""
        return f"{who} was killed by {failure.signal}: {failure.decoded.cause}{detail}", failure.decoded.fix
    if failure.kind == "signal":
        return (f"{who} was killed by {failure.signal}",
                "Find what killed it: the kernel OOM killer (dmesg), a cluster scheduler, or a crash in native code. "
                "Each rank needs its own share of host memory.")
    return f"{who} exited with code {failure.code}", "Look at this rank's output above for the cause."


def _teardown_abort(aborts: dict[int, str]) -> CheckResult:
    """Ranks killed after their script finished cleanly: torch's own exit crashed, not the script."""
    ranks = sorted(aborts)
    signals = ", ".join(sorted(set(aborts.values())))
    finding = Finding(
        check=ID, severity="warning", ranks=tuple(ranks), location=None,
        message=(f"{fmt_ranks(ranks)} {'was' if len(ranks) == 1 else 'were'} killed by {signals} after the script "
                 "had finished cleanly: torch crashed in its own teardown (gloo's worker threads still releasing a "
                 "finished collective while the interpreter exits: \"terminate called without an active "
                 "exception\"). Every check above judged a complete run, but torchrun reports the job as failed"),
        fix=("Nothing in the training is wrong: this is a race in torch's gloo backend at interpreter exit "
             "(ddpdoctor's bootstrap waits for those threads, so it is rare under ddpdoctor and more frequent under "
             "plain torchrun). Rerun where the exit code matters."),
        evidence=TeardownAbort(signals={str(r): s for r, s in sorted(aborts.items())}))
    return CheckResult(findings=[finding], summary=f"{fmt_ranks(ranks)} crashed in torch's teardown after finishing")


def failed_ranks(failures: list[RankFailure]) -> set[int]:
    """The ranks among ``failures`` (the launcher, rank None, left out)."""
    return {f.rank for f in failures if f.rank is not None}


def analyze(evidence: Evidence) -> CheckResult:
    failures = facts.failures.rank_failures(evidence)
    if not failures:
        unfinished = _unfinished(evidence)
        if unfinished is not None:
            return CheckResult(findings=[unfinished], summary=unfinished.message.split(":")[0])
        if evidence.stop is not None and evidence.stop.reason == "interrupted":
            return CheckResult(
                summary=f"no rank failed before {evidence.stop.signal or 'the signal'} interrupted the run")
        aborts = facts.failures.teardown_aborts(evidence)
        if aborts:
            return _teardown_abort(aborts)
        return CheckResult(summary="no rank failed")
    primary = facts.failures.first_failure(evidence)
    secondary_only = primary is None
    chosen = primary or failures[0]
    same = [f for f in failures if f.secondary == chosen.secondary and _same_cause(f, chosen)]
    ranks = sorted({f.rank for f in same if f.rank is not None})
    if len(ranks) > 1:
        who = f"every rank ({', '.join(map(str, ranks))})" if len(ranks) == evidence.world_size else fmt_ranks(ranks)
    else:
        who = f"rank {chosen.rank}" if chosen.rank is not None else "the launcher process"
    message, fix = _describe(chosen, who)
    step = _last_step(evidence, chosen.rank)
    if step:
        message += f" after optimizer step {step}"
    elif step == 0:
        message += " before the first optimizer step"
    if secondary_only:
        message += ("; this is a failure in communication after a peer stopped, and no rank reported an error "
                    "of its own")
        fix = "Look at what the other ranks did just before: one of them left the job early."
    others = [f for f in failures if f not in same]
    raised = chosen.kind == FailureKind.EXCEPTION
    evidence_out = Failed(
        rank=chosen.rank, ranks=ranks, kind=chosen.kind, last_step=step, seq=chosen.seq, secondary_only=secondary_only,
        reduction_error=any(is_reduction_error(f.message) for f in failures),
        failed_ranks=sorted(failed_ranks(failures)),
        exception=chosen.type if raised else ABSENT, message=chosen.message if raised else ABSENT,
        frames=chosen.frames if raised else ABSENT, exitcode=ABSENT if raised else chosen.code,
        signal=ABSENT if raised else chosen.signal,
        decoded={"code": chosen.decoded.code, "cause": chosen.decoded.cause, "detail": chosen.decoded.detail}
        if chosen.decoded else None,
        secondary=[{"rank": f.rank, "kind": f.kind, "summary": f.headline if f.kind == "exception"
                    else str(f.signal or f.code)} for f in others])
    finding = Finding(check=ID, severity="error", message=message, fix=fix, ranks=tuple(ranks),
                      location=chosen.location, evidence=evidence_out)
    later = sorted({f.rank for f in others if f.rank is not None})
    summary = f"{who} failed" + ("" if len(ranks) > 1 else " first") + \
        (f"; {fmt_ranks(later)} failed after it" if later else "")
    return CheckResult(findings=[finding], summary=summary)


CHECK = Check(id=ID, title="every rank finished", analyze=analyze, docs=DOCS, order=90,
              probes=("flight-recorder-missing",),
              evidence=(TimedOut, TeardownAbort, Failed), explains=EXPLAINS,
              sources=frozenset({RUN, ENVIRONMENT, POSTMORTEM}))
