"""The monitor: one place for the hang, timeout and interrupt policy, whatever the launch mode.

It polls the transport for heartbeats, routes rank output to the display, and decides when to stop
a job that will not end by itself. It never stops the processes itself: it returns why the job
must stop, with every rank's state, and the pipeline stops them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ddpdoctor.schema.observations import Heartbeat, RankState, StackDump, StopSnapshot
from ddpdoctor.supervisor.display import Display
from ddpdoctor.supervisor.hang import HangDetector, classify
from ddpdoctor.supervisor.job_output import OutputRouter
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import Transport

POLL_S = 0.5  # heartbeats are written every 0.5 s
TRACK_S = 2.0  # how often to scan /proc for new descendants (cheap, but ranks share the CPUs)
NO_PROGRESS_FACTOR = 10.0  # a stall that is not provably a hang stops the job after this many thresholds
# A hang is declared from two looks at every rank this far apart, both finding each one waiting in the
# same place with no progress between: one look can catch ranks passing through a collective on a
# loaded machine (a stack read as a rank arrives, a rank too starved to answer at once).
CONFIRM_S = 1.0


class Job(Protocol):
    def finished(self) -> bool: ...
    def drain(self) -> list[tuple[int, str]]: ...
    def track(self) -> None: ...


@dataclass
class MonitorResult:
    stop: Optional[StopSnapshot] = None  # None: the job ended by itself
    stalls: list[StopSnapshot] = field(default_factory=list)  # no-progress episodes that resolved


def _same_waits(first: StopSnapshot, second: StopSnapshot, live: dict[int, Heartbeat]) -> bool:
    """Every live rank waits in the same place in both looks (what it waits in, and its innermost frame)."""
    def where(snapshot: StopSnapshot, rank: int) -> tuple:
        state = snapshot.ranks.get(rank)
        if state is None:
            return ()
        inner = state.stack[-1] if state.stack else {}
        return state.waiting_in, inner.get("file"), inner.get("function")
    return all(r in first.ranks and where(first, r) == where(second, r) for r in live)


def _lengthen(stall: StopSnapshot, detector: HangDetector, now: float, live: dict[int, Heartbeat]) -> None:
    """A stall that goes on keeps its first look (where each rank was: later looks can catch the ranks
    already past it, before a heartbeat shows their progress) and takes each live rank's latest age,
    measured now (``t``, so that the timeline's interval ``[t - age, t]`` is the stall's): a job can
    stall twice, and the report names the longest, which the first look's ages (all about the
    threshold) could not tell apart."""
    stall.t = time.time()
    for rank, state in stall.ranks.items():
        if rank in live:
            state.stalled_s = round(detector.stall_age(now, rank), 2)


class Monitor:
    def __init__(self, *, transport: Transport, display: Display, router: OutputRouter,
                 hang_timeout_s: Optional[float], timeout_s: Optional[float], world_size: int = 0,
                 detect_hangs: bool = True, signals: Optional[StopSignals] = None) -> None:
        self.transport = transport
        self.display = display
        self.router = router
        self.detector = HangDetector(hang_timeout_s=hang_timeout_s)
        self.timeout_s = timeout_s
        self.world_size = world_size
        self.detect_hangs = detect_hangs
        self.signals = signals or StopSignals()  # the pipeline's, installed for the whole run
        self._beats: dict[int, Heartbeat] = {}
        self._last_poll = 0.0

    def watch(self, job: Job) -> MonitorResult:
        try:
            return self._watch(job)
        finally:
            self.router.route(job.drain())

    def _interrupted(self, *, ask_peers: bool) -> Optional[tuple[str, float, Optional[int]]]:
        """(signal name, wall time, the rank whose ddpdoctor got it, None for this process) once a
        stop signal reached this process or (inside an existing launch, at poll time) a peer's."""
        if self.signals.received is not None:
            return self.signals.name or "", self.signals.received_at, None
        peer = getattr(self.transport, "interrupted", None) if ask_peers else None
        return peer() if peer is not None else None

    def _watch(self, job: Job) -> MonitorResult:
        result = MonitorResult()
        started = time.monotonic()
        last_tracked = 0.0
        next_stacks = 0.0
        stall: Optional[StopSnapshot] = None
        unconfirmed: Optional[StopSnapshot] = None  # a first look that found every live rank waiting
        while True:
            self.router.route(job.drain())
            interrupted = self._interrupted(ask_peers=False)
            if job.finished() and interrupted is None:
                break  # a signal that ended the ranks before this loop saw it still makes the run interrupted
            if interrupted is None:
                time.sleep(0.05)
            now = time.monotonic()
            if now - self._last_poll < POLL_S and interrupted is None:
                continue
            self._last_poll = now
            if now - last_tracked > TRACK_S:
                job.track()
                last_tracked = now
            beats = self._poll(now)
            live = {r: b for r, b in beats.items() if self.transport.alive(b)}
            interrupted = interrupted or self._interrupted(ask_peers=True)
            if interrupted is not None:
                name, at, rank = interrupted
                by = "" if rank is None else f" (sent to rank {rank})"
                self.display.notice(f"received {name}{by}: stopping every rank")
                self.router.route(job.drain())
                self.router.muted = True  # what the ranks print while being stopped is noise (kept in the tails)
                result.stop = self._snapshot("interrupted", live, now, signal_name=name)
                result.stop.t = at  # what ranks raise or print from here on is the stop's doing
                result.stop.signal_rank = rank
                break
            if self.timeout_s is not None and now - started > self.timeout_s:
                self.display.notice(f"--timeout {self.timeout_s:g}s expired: stopping every rank")
                result.stop = self._snapshot("timeout", live, now)
                break
            if not self.detect_hangs:
                continue
            threshold = self.detector.threshold_s()
            age = self.detector.job_stall_age(now, set(live)) if live else 0.0
            progress = getattr(self.display, "progress", None)
            if progress is not None:  # the live view's "no progress 12 s / hang at 30 s"
                progress(age, threshold)
            if age <= threshold:
                unconfirmed = None
                if stall is not None:
                    result.stalls.append(stall)
                    stall = None
                continue
            if stall is not None:
                _lengthen(stall, self.detector, now, live)
            if now < next_stacks:
                continue
            next_stacks = now + max(2.0, threshold / 2)
            snapshot = self._snapshot("hang", live, now)
            states = [snapshot.ranks[r].state for r in live]
            if states and all(s == "waiting" for s in states):
                if unconfirmed is None or not _same_waits(unconfirmed, snapshot, live):
                    unconfirmed = snapshot
                    next_stacks = now + CONFIRM_S
                    continue
                self.display.notice(f"no rank made progress for {age:.0f}s and every live rank waits for its "
                                    "peers: collecting stacks and stopping the job")
                result.stop = snapshot
                break
            unconfirmed = None
            if age > NO_PROGRESS_FACTOR * threshold:
                self.display.notice(f"no rank made progress for {age:.0f}s: stopping the job")
                snapshot.reason = "no-progress"
                result.stop = snapshot
                break
            if stall is None:  # the episode's first look says where it stalled; later looks only lengthen it
                busy = [f"rank {r} {snapshot.ranks[r].state} in {snapshot.ranks[r].waiting_in or 'its own code'}"
                        for r in sorted(live) if snapshot.ranks[r].state != "waiting"]
                self.display.notice(f"no progress for {age:.0f}s, but not a hang while {'; '.join(busy)}")
                snapshot.reason = "no-progress"
                stall = snapshot
        if stall is not None:
            result.stalls.append(stall)
        if result.stop is not None:
            self.router.route(job.drain())
            self.router.muted = True  # what the ranks print while ddpdoctor stops them is noise (kept in the tails)
        return result

    def _poll(self, now: float) -> dict[int, Heartbeat]:
        beats = self.transport.heartbeats()
        self._beats = beats
        self.router.learn(beats)
        for rank, beat in beats.items():
            self.detector.observe(now, rank, beat.progress, beat.steps)
        self.display.update(beats, time.time())
        return beats

    def _snapshot(self, reason: str, live: dict[int, Heartbeat], now: float, *,
                  signal_name: Optional[str] = None) -> StopSnapshot:
        dumps: dict[int, StackDump] = self.transport.request_stacks(live) if live else {}
        ranks: dict[int, RankState] = {}
        for rank, beat in sorted(self._beats.items()):
            dump = dumps.get(rank)
            heartbeat = dump.heartbeat if dump else beat
            stack = dump.stack if dump else []
            if rank not in live:
                ranks[rank] = RankState(rank=rank, state="exited", heartbeat=heartbeat,
                                        stalled_s=round(self.detector.stall_age(now, rank), 2))
                continue
            state, waiting_in = classify(stack, heartbeat)
            ranks[rank] = RankState(rank=rank, state=state, waiting_in=waiting_in, heartbeat=heartbeat, stack=stack,
                                    stalled_s=round(self.detector.stall_age(now, rank), 2))
        world = self.world_size or max([b.world_size or 0 for b in self._beats.values()] + [0])
        for rank in range(world):
            ranks.setdefault(rank, RankState(rank=rank, state="never started"))
        return StopSnapshot(reason=reason, threshold_s=self.detector.threshold_s(), ranks=ranks, signal=signal_name,
                            t=time.time())
