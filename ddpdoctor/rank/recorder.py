"""The in-rank evidence writer: one JSON line per event, written as it happens.

Each rank process appends to ``events-<pid>.jsonl`` in the evidence directory, line-buffered, so a
crash, a SIGKILL or a hang loses nothing already observed. Counters here (progress, collective
sequence, optimizer steps) also feed the heartbeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Callable, Iterator, Optional

from ddpdoctor.rank.clock import CollectiveClock
from ddpdoctor.rank.host_copies import HostCopies
from ddpdoctor.schema import layout
from ddpdoctor.schema.events import DDP_PHASE_WORDS, Event, ProbeError
from ddpdoctor.schema.observations import Heartbeat
from ddpdoctor.schema.settings import RankSettings


# One encoder for every line: json.dumps with options builds a new one per call (a few microseconds,
# and a step writes several events). encode() keeps no state between calls: any thread may use it.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


class StepTiming:
    """When the phases of the running optimizer step began (wall times), for the report's timeline
    and --trace: the first DDP forward, the first and last gradient, the optimizer's own step, and
    the seconds spent waiting in DataLoader.__next__. Reset after every step."""

    __slots__ = ("forward", "backward", "backward_end", "optimizer", "data_wait_s")

    def __init__(self) -> None:
        self.forward: Optional[float] = None
        self.backward: Optional[float] = None
        self.backward_end: Optional[float] = None
        self.optimizer: Optional[float] = None
        self.data_wait_s = 0.0

    def encode(self, end: float) -> list:
        """[data wait, then the seconds before ``end`` at which forward, backward, its end and the
        optimizer step began] (None where unseen): the compact form a Step event carries."""
        def before(t: Optional[float]) -> Optional[float]:
            return None if t is None else round(max(0.0, end - t), 5)

        return [round(self.data_wait_s, 5), before(self.forward), before(self.backward),
                before(self.backward_end), before(self.optimizer)]


class Recorder:
    """Per-process event sink and progress counters shared by all probes."""

    def __init__(self, settings: RankSettings) -> None:
        self.evidence_dir = settings.evidence_dir
        self.fingerprint_every = max(0, settings.fingerprint_every)  # 0: the automatic schedule
        self.max_steps = settings.max_steps
        self.max_epochs = settings.max_epochs
        self.one_rank = (settings.one_rank_role, settings.one_rank_dir, settings.one_rank_steps)  # --against-one-rank
        self.pid = os.getpid()
        self.rank: Optional[int] = _env_int("RANK")
        self.world_size: Optional[int] = _env_int("WORLD_SIZE")
        self.local_rank: Optional[int] = _env_int("LOCAL_RANK")
        self.node_rank: Optional[int] = _env_int("GROUP_RANK")
        self.agent = settings.agent
        self.host = socket.gethostname()
        self.progress = 0  # bumped by every probe callback; a stalled value means a stalled rank
        self.clock = CollectiveClock(self._write)  # world-group collectives, DDP's own included
        self.last_collective: Optional[dict] = None
        self.num_steps = 0
        self.epoch: Optional[int] = None
        self.activity = "starting"
        self.activity_site: Optional[dict] = None
        self.activity_t = time.time()  # when the activity last changed
        self.passes = 0  # training loader passes completed: the live view's epoch without set_epoch
        self.gradients_complete = False  # every DDP parameter got its gradient in the running backward
        self.exit_info: Optional[dict] = None  # how the script ended, for the last heartbeat
        self.timing = StepTiming()
        self.on_dump: list[Callable[[], None]] = []  # run by the watchdog when a stack dump is requested
        self._failed_probes: set[tuple[str, Optional[str], str]] = set()
        # Device values on their way to the host (a sampled step's fingerprints): see host_copies.py.
        self.host_copies = HostCopies(on_error=lambda exc: self.probe_failed("host copies", exc))
        self._lock = threading.Lock()
        self._owner = threading.get_ident()
        os.makedirs(self.evidence_dir, exist_ok=True)
        self._file = open(layout.events_path(self.evidence_dir, self.pid), "a", buffering=1)

    @property
    def collective_seq(self) -> int:
        """World-group collectives this rank has taken part in so far (its collective clock)."""
        return self.clock.units

    def emit(self, event: Event) -> None:
        """Append one event, stamped with time, rank, step and collective sequence."""
        self._append(self.stamp(event))

    def stamp(self, event: Event, like: Optional[Event] = None) -> Event:
        """Stamp ``event`` with the time, rank, step and collective sequence of now (or those of
        ``like``): an event whose content arrives later (:meth:`emit_stamped`) keeps the moment it
        describes."""
        if like is not None:
            event.t, event.rank, event.step, event.seq = like.t, like.rank, like.step, like.seq
            return event
        if threading.get_ident() == self._owner:  # the clock is read and booked by the main thread only
            self.clock.sync()
        event.t = time.time()
        return self._counters(event)

    def emit_stamped(self, event: Event) -> None:
        """Append an event stamped earlier (:meth:`stamp`)."""
        self._append(event)

    def _write(self, event: Event) -> None:
        """Append an event of now (the collective clock's own, which carry their own time)."""
        self._append(self._counters(event))

    def _counters(self, event: Event) -> Event:
        event.rank = self.rank
        event.step = self.num_steps
        event.seq = self.clock.units
        return event

    def _append(self, event: Event) -> None:
        line = _ENCODER.encode(event.to_json())
        with self._lock:
            self.progress += 1
            if not self._file.closed:
                self._file.write(line + "\n")

    def probe_failed(self, probe: str, exc: BaseException, *, target: Optional[str] = None,
                     phase: str = "run") -> None:
        """Record a probe failure once per probe, target and error type; never raises."""
        key = (probe, target, type(exc).__name__)
        if key in self._failed_probes:
            return
        self._failed_probes.add(key)
        try:
            self.emit(ProbeError(probe=probe, error=f"{type(exc).__name__}: {exc}"[:500], target=target, phase=phase))
        except Exception:  # the evidence file itself is gone: nothing more to do
            pass

    @contextlib.contextmanager
    def guard(self, probe: str, target: Optional[str] = None) -> Iterator[None]:
        """Run probe code: a failure is recorded, never raised into the user's script."""
        try:
            yield
        except Exception as exc:
            self.probe_failed(probe, exc, target=target)

    def set_activity(self, activity: str, site: Optional[dict] = None) -> None:
        if activity != self.activity:
            self.activity_t = time.time()
        self.activity = activity
        self.activity_site = site
        self.progress += 1

    def heartbeat(self) -> Heartbeat:
        seq = self.clock.peek()
        last = self.last_collective
        if seq and (last is None or (last.get("n") or 0) < seq):
            # DDP's own collectives since the last traced call: numbered, named by what the rank was doing
            last = {"op": DDP_PHASE_WORDS.get(self.clock.phase.name, "collective"), "n": seq, "site": None}
        return Heartbeat(pid=self.pid, rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
                         node_rank=self.node_rank, agent=self.agent, host=self.host, t=time.time(),
                         progress=self.progress, steps=self.num_steps, epoch=self.epoch, seq=seq,
                         activity=self.activity, site=self.activity_site, last_collective=last,
                         passes=self.passes, exit=self.exit_info)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
