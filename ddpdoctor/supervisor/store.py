"""The transport inside an existing launch: the job's c10d store, no shared filesystem needed.

Every rank's ddpdoctor process supervises one child (the rank itself) through files on its own
machine, and a :class:`StoreRelay` thread publishes that child's heartbeats, stack dumps and
events in the store. Rank 0 runs the monitor over a :class:`StoreTransport`, which reads them
back for every rank. The store is torchrun's agent store when there is one, otherwise a TCPStore
that rank 0 hosts on MASTER_PORT+1 (DDPDOCTOR_STORE_PORT overrides).

This is the only supervisor-side module that imports torch, lazily, inside :func:`connect`: in
this mode ddpdoctor runs inside a rank of someone else's launch, where torch is there anyway.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

from ddpdoctor.schema.observations import Failure, Heartbeat, StackDump
from ddpdoctor.supervisor.jobs import SubprocessJob
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import STACK_WAIT_S, Collected, FileTransport

if TYPE_CHECKING:
    from ddpdoctor.supervisor.launch import ExistingLaunch

CONNECT_TIMEOUT_S = 60.0
GATHER_WAIT_S = 60.0
REPORT_WAIT_S = 120.0
STALE_S = 10.0
GOODBYE_WAIT_S = 5.0
ABORT_WAIT_S = 3.0
RELAY_PERIOD_S = 0.5


def connect(launch: "ExistingLaunch") -> Any:
    """A client of the job's store (on rank 0 without torchrun's agent store, also its server)."""
    quiet = "torch" not in sys.modules and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:  # c10d's C++ warnings (a peer's store connection closing) are read once, at torch's import
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed import PrefixStore, TCPStore
    finally:
        if quiet:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    timeout = timedelta(seconds=CONNECT_TIMEOUT_S)
    if launch.agent_store:
        store = TCPStore(launch.master_addr, launch.master_port, is_master=False, timeout=timeout)
    else:
        port = int(os.environ.get("DDPDOCTOR_STORE_PORT") or launch.master_port + 1)
        store = TCPStore(launch.master_addr, port, launch.world_size, is_master=launch.rank == 0, timeout=timeout,
                         wait_for_workers=False)
    return PrefixStore(f"ddpdoctor/{launch.run_id}/", store)


def _pack(collected: Collected) -> bytes:
    return zlib.compress(json.dumps(collected.processes).encode())


def _unpack(data: bytes) -> list[list[str]]:
    return json.loads(zlib.decompress(data).decode())


class StoreRelay(threading.Thread):
    """In every rank's ddpdoctor: the local child's heartbeats, stacks and events, into the store."""

    def __init__(self, store: Any, rank: int, local: FileTransport, child: SubprocessJob, *,
                 signals: Optional[StopSignals] = None, on_abort: Optional[Callable[[], None]] = None) -> None:
        super().__init__(name="ddpdoctor-store-relay", daemon=True)
        self.store = store
        self.rank = rank
        self.local = local
        self.child = child
        self.signals = signals
        self.on_abort = on_abort
        self.aborted = threading.Event()
        self._stop_event = threading.Event()
        self._last_token = ""
        self._signal_sent = False

    def _publish_signal(self) -> None:
        """A stop signal this rank's ddpdoctor got: rank 0 stops the whole job for it (signals.py)."""
        if self._signal_sent or self.rank == 0 or self.signals is None or self.signals.received is None:
            return
        self._signal_sent = True
        self.store.set("signal", json.dumps({"signal": self.signals.name, "rank": self.rank,
                                             "t": self.signals.received_at}))

    def run(self) -> None:
        while not self._stop_event.wait(RELAY_PERIOD_S):
            try:
                self.tick()
            except Exception:  # the store went away: the job is ending
                return

    def tick(self) -> None:
        self._publish_signal()
        beats = self.local.heartbeats()
        beat = beats.get(self.rank) or next(iter(beats.values()), None)
        if beat is not None:
            self.store.set(f"hb/{self.rank}", json.dumps(beat.to_json()))
        if self.store.check(["dump"]):
            token = self.store.get("dump").decode()
            if token != self._last_token:
                self._last_token = token
                live = {self.rank: beat} if beat is not None and self.local.alive(beat) else {}
                dumps = self.local.request_stacks(live) if live else {}
                self.store.set(f"events/{self.rank}", _pack(self.local.collect()))
                if self.rank in dumps:
                    dump = dumps[self.rank]
                    self.store.set(f"stack/{self.rank}", json.dumps({**dump.to_json(), "token": token}))
        if not self.aborted.is_set() and self.store.check(["abort"]):
            self.aborted.set()
            if self.on_abort is not None:
                self.on_abort()
            self.child.stop()

    def finish(self, *, exit_code: int, tail: list[str]) -> None:
        """Stop relaying, then leave this rank's events, output tail and exit code in the store."""
        self._stop_event.set()
        self.join(timeout=5)
        self._publish_signal()
        self.store.set(f"events/{self.rank}", _pack(self.local.collect()))
        self.store.set(f"tail/{self.rank}", json.dumps(tail))
        self.store.set(f"exit/{self.rank}", str(exit_code))

    def wait_for_report(self) -> bool:
        """Non-zero ranks stay until rank 0 has gathered their evidence and built the report; True
        once it has (then this rank's outcome is in rank 0's report and exit code)."""
        deadline = time.monotonic() + REPORT_WAIT_S
        while time.monotonic() < deadline:
            try:
                if self.store.check(["reported"]):
                    self.store.add("goodbyes", 1)  # the last request: rank 0 may close the store after it
                    return True
            except Exception:
                return False
            time.sleep(0.2)
        return False


class StoreTransport:
    """On rank 0: every rank's heartbeats, stacks and events, read from the store."""

    def __init__(self, store: Any, world_size: int) -> None:
        self.store = store
        self.world_size = world_size
        self._changed: dict[int, tuple[float, float]] = {}  # rank -> (heartbeat t, local time it changed)
        self._missing: set[int] = set()

    def heartbeats(self) -> dict[int, Heartbeat]:
        beats = {}
        now = time.monotonic()
        for rank in range(self.world_size):
            key = f"hb/{rank}"
            if self.store.check([key]):
                beat = Heartbeat.from_json(json.loads(self.store.get(key)))
                beats[rank] = beat
                if self._changed.get(rank, (None,))[0] != beat.t:
                    self._changed[rank] = (beat.t, now)
        return beats

    def alive(self, beat: Heartbeat) -> bool:
        """Running, judged on this machine's clock (the ranks' clocks may differ): a heartbeat that
        stopped changing for STALE_S means its rank or its relay is gone."""
        if beat.activity == "exited" or self.store.check([f"exit/{beat.rank}"]):
            return False
        changed = self._changed.get(beat.rank)
        return changed is None or time.monotonic() - changed[1] < STALE_S

    def request_stacks(self, ranks: dict[int, Heartbeat], wait_s: float = STACK_WAIT_S) -> dict[int, StackDump]:
        token = uuid.uuid4().hex
        self.store.set("dump", token)
        deadline = time.monotonic() + wait_s + 2 * RELAY_PERIOD_S
        stacks: dict[int, StackDump] = {}
        while time.monotonic() < deadline and len(stacks) < len(ranks):
            for rank in set(ranks) - set(stacks):
                key = f"stack/{rank}"
                if self.store.check([key]):
                    data = json.loads(self.store.get(key))
                    if data.get("token") == token:
                        stacks[rank] = StackDump.from_json(data)
            time.sleep(0.05)
        return stacks

    def interrupted(self) -> Optional[tuple[str, float, Optional[int]]]:
        """(signal, wall time, rank) once a peer's ddpdoctor got a stop signal."""
        if not self.store.check(["signal"]):
            return None
        data = json.loads(self.store.get("signal"))
        return data.get("signal") or "signal", float(data.get("t") or time.time()), data.get("rank")

    def exited(self, rank: int) -> bool:
        return self.store.check([f"exit/{rank}"])

    def collect(self) -> Collected:
        deadline = time.monotonic() + GATHER_WAIT_S
        while time.monotonic() < deadline and not all(self.exited(r) for r in range(self.world_size)):
            time.sleep(0.1)
        collected = Collected()
        for rank in range(self.world_size):
            if self.store.check([f"events/{rank}"]):
                collected.processes.extend(_unpack(self.store.get(f"events/{rank}")))
            if self.store.check([f"tail/{rank}"]):
                collected.output_tails[rank] = json.loads(self.store.get(f"tail/{rank}"))
            if self.exited(rank):
                code = int(self.store.get(f"exit/{rank}"))
                if code != 0:
                    collected.failures.append(Failure(rank=rank, exitcode=code))
            else:
                collected.missing_ranks.append(rank)
        self._missing = set(collected.missing_ranks)
        return collected

    def abort(self, wait_s: float = ABORT_WAIT_S) -> None:
        """Tell every rank's ddpdoctor to stop its rank, and give them a moment to do so before rank 0
        stops its own: a peer that outlives rank 0's rank only prints "Connection closed by peer"."""
        self.store.set("abort", "1")
        peers = [r for r in range(1, self.world_size) if self.store.check([f"hb/{r}"])]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(self.exited(r) for r in peers):
            time.sleep(0.05)

    def reported(self, wait_s: float = GOODBYE_WAIT_S) -> None:
        """Tell the peers the report is built, and wait (briefly) until each one that is still there
        said goodbye: a store that rank 0 closes under a peer's request makes the peer print a C++
        stack of "Connection was likely closed"."""
        self.store.set("reported", "1")
        peers = [r for r in range(1, self.world_size) if r not in self._missing]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.store.add("goodbyes", 0) < len(peers):
            time.sleep(0.05)


class WorldJob:
    """Rank 0's view of the whole job: its own child, and every other rank through the store."""

    def __init__(self, child: SubprocessJob, transport: StoreTransport) -> None:
        self.child = child
        self.transport = transport
        self._child_done_at: Optional[float] = None

    def finished(self) -> bool:
        if not self.child.finished():
            return False
        now = time.monotonic()
        if self._child_done_at is None:
            self._child_done_at = now
        others = [r for r in range(self.transport.world_size) if not self.transport.exited(r)]
        beats = self.transport.heartbeats()
        running = [r for r in others if r in beats and self.transport.alive(beats[r])]
        never_seen = [r for r in others if r not in beats]
        if running:
            return False  # still watched for hangs by the monitor
        return not never_seen or now - self._child_done_at > GATHER_WAIT_S

    def drain(self) -> list[tuple[int, str]]:
        return self.child.drain()

    def track(self) -> None:
        self.child.track()
