"""Facts of how the ranks failed: each rank's own exception, exit code or signal, causes told from symptoms."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.analysis.decode import DecodedError, decode
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import ExceptionEvent, Exit, Frames, SysExit
from ddpdoctor.schema.findings import Location

__all__ = ["SECONDARY_MARKERS", "SIGNAL_SLACK_S", "REDUCTION_ERRORS", "is_reduction_error", "RankFailure",
           "rank_failures", "teardown_aborts", "first_failure"]

# Errors a rank raises because a peer died or stopped answering: symptoms, not causes.
SECONDARY_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
    "NCCL communicator was aborted", "Socket Timeout", "timed out", "DistNetworkError", "Connection refused",
    "process group has been destroyed", "ProcessGroupGloo::", "Read error", "Write error",
)

# A signal reaches the ranks and ddpdoctor about together (a terminal's process group, slurmstepd):
# what a rank raised this long before ddpdoctor saw the signal is still the signal's doing.
SIGNAL_SLACK_S = 1.0
_SIGNAL_EXIT_CODES = frozenset(128 + n for n in (1, 2, 10, 12, 15))  # SIGHUP, SIGINT, SIGUSR1, SIGUSR2, SIGTERM

# DDP's error when a parameter got no gradient, and the rewording Lightning raises instead.
REDUCTION_ERRORS = ("Expected to have finished reduction in the prior iteration",
                    "has parameters that were not used in producing the loss")


def is_reduction_error(message: str) -> bool:
    return any(marker in message for marker in REDUCTION_ERRORS)


@dataclass(frozen=True)
class RankFailure:
    """How one rank (or the launcher, rank None) failed."""

    rank: Optional[int]
    kind: str  # "exception" | "exit" (sys.exit) | "signal" | "exitcode"
    t: float
    type: str = ""
    message: str = ""
    location: Optional[Location] = None
    frames: Frames = field(default_factory=list)
    seq: int = 0
    step: int = 0
    code: Optional[int] = None
    signal: Optional[str] = None
    decoded: Optional[DecodedError] = None
    secondary: bool = False

    @property
    def headline(self) -> str:
        first = _shorten(self.message.strip().splitlines()[0]) if self.message.strip() else ""
        return f"{self.type}: {first}" if self.type else first


@derived
def rank_failures(evidence: Evidence) -> list[RankFailure]:
    """Every rank that failed, with its own exception, exit code or signal, oldest first."""
    tails = evidence.observations.output_tails
    found: list[RankFailure] = []
    explained: set[Optional[int]] = set()
    launcher: list[tuple[Optional[int], ExceptionEvent]] = [
        (None, e) for e in evidence.unranked if isinstance(e, ExceptionEvent)]
    stop = evidence.stop
    interrupted = stop is not None and stop.reason == "interrupted"
    for rank, event in [*evidence.events(ExceptionEvent), *launcher]:
        if interrupted and event.type == "KeyboardInterrupt":
            continue  # the Ctrl-C that interrupted the run, raised in the rank
        decoded = decode(event.message, tails.get(rank, []) if rank is not None else [])
        secondary = (event.type == "KeyboardInterrupt" or _is_secondary(event.message)
                     or bool(decoded and decoded.secondary))
        if secondary and stop is not None and stop.t and event.t >= stop.t - (SIGNAL_SLACK_S if interrupted else 0):
            continue  # a peer's error from ddpdoctor stopping the job, not from the job itself
        found.append(RankFailure(rank=rank, kind="exception", t=event.t, type=event.type, message=event.message,
                                 location=Location.from_site(event.location), frames=event.frames, seq=event.seq,
                                 step=event.step, decoded=decoded, secondary=secondary))
        explained.add(rank)
    for rank, exit_event in evidence.events(SysExit):
        if interrupted and stop is not None and exit_event.code in _SIGNAL_EXIT_CODES \
                and exit_event.t >= stop.t - SIGNAL_SLACK_S:
            continue  # the script's own signal handler turned the stop signal into sys.exit(128+N)
        if rank not in explained:
            found.append(RankFailure(rank=rank, kind="exit", t=exit_event.t, code=exit_event.code, seq=exit_event.seq,
                                     step=exit_event.step, location=Location.from_site(exit_event.location)))
            explained.add(rank)
    if not evidence.stopped_by_ddpdoctor:
        for failure in evidence.failures:
            # torchrun stops the survivors with SIGTERM after the first failure: not a cause.
            if failure.rank in explained or failure.signal == "SIGTERM":
                continue
            if not failure.signal and not failure.exitcode:
                continue
            ev = evidence.ranks.get(failure.rank)
            if failure.rank in teardown_aborts(evidence):
                continue  # the script had finished: torch's own teardown crashed (see teardown_aborts)
            last = ev.events[-1] if ev and ev.events else None
            found.append(RankFailure(rank=failure.rank, kind="signal" if failure.signal else "exitcode",
                                     t=last.t if last else failure.t, code=failure.exitcode, signal=failure.signal,
                                     seq=last.seq if last else 0, step=last.step if last else 0,
                                     decoded=decode("", tails.get(failure.rank, []))))
            explained.add(failure.rank)
    return sorted(found, key=lambda f: f.t)


@derived
def teardown_aborts(evidence: Evidence) -> dict[int, str]:
    """rank -> the signal that killed it after its script had finished cleanly (its Exit event
    with code 0 was written): a crash in torch's own teardown, not in the script."""
    found: dict[int, str] = {}
    if evidence.stopped_by_ddpdoctor:
        return found
    for failure in evidence.failures:
        ev = evidence.ranks.get(failure.rank)
        if failure.signal and failure.signal != "SIGTERM" and ev is not None \
                and any(e.code == 0 for e in ev.of(Exit)):
            found[failure.rank] = failure.signal
    return found


@derived
def first_failure(evidence: Evidence) -> Optional[RankFailure]:
    """The earliest failure that is a cause (not a peer's symptom); None if there are only symptoms."""
    return next((f for f in rank_failures(evidence) if not f.secondary), None)


def _shorten(line: str, limit: int = 200) -> str:
    """A long error line cut after its first sentences, or between words, never inside one."""
    if len(line) <= limit:
        return line
    end = line.rfind(". ", 0, limit)
    if end > limit // 3:
        return line[: end + 1]
    return textwrap.shorten(line, limit, placeholder=" …")


def _is_secondary(message: str) -> bool:
    lowered = message.lower()
    return any(marker.lower() in lowered for marker in SECONDARY_MARKERS)
