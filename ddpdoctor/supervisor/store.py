"""The transport inside an existing launch: one relay per node over the job's c10d store.

The ddpdoctor leading each node (node.py) publishes its node's heartbeats as one bundle per relay
period, answers stack requests with one bundle of the node's stacks, and at the end leaves one
bundle of the node's events, exit codes and output tails. Rank 0 reads a key per node, never one
per rank, and holds per rank only the latest heartbeat: its memory grows with the evidence, not
with the number of ranks. The store is torchrun's agent store when there is one, otherwise a
TCPStore that rank 0 hosts on MASTER_PORT+1 (DDPDOCTOR_STORE_PORT overrides).

Keys (under ``ddpdoctor/<run id>/``): ``groups`` (a counter) and ``groups/<i>`` register the nodes;
``g/<node>/hb``, ``g/<node>/stacks`` and ``g/<node>/final`` are a node's bundles; ``dump`` (a token),
``abort``, ``signal``, ``reported`` and ``goodbyes`` are rank 0's requests and the nodes' answers.

This is the only supervisor-side module that imports torch, lazily, inside :func:`connect`, and
only the node leaders call it: in this mode ddpdoctor runs inside a rank of someone else's launch,
where torch is there anyway.
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
from ddpdoctor.supervisor.node import NodeDir, sweep_stale
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import STACK_WAIT_S, Collected, FileTransport

if TYPE_CHECKING:
    from ddpdoctor.supervisor.launch import ExistingLaunch

CONNECT_TIMEOUT_S = 60.0
GATHER_WAIT_S = 60.0  # for ranks that never showed up, and for a node's ranks to end after its leader's
REPORT_WAIT_S = 120.0
STALE_S = 10.0
GOODBYE_WAIT_S = 5.0
ABORT_WAIT_S = 3.0
ABORT_GRACE_S = 1.5  # from hearing of an abort to stopping the rank: the abort reaches every node meanwhile
RELAY_PERIOD_S = 0.5
QUIET_S = 5.0  # a node's ranks all ended this long ago: stop waiting for their ddpdoctors' exit codes


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


def _pack(value: Any) -> bytes:
    return zlib.compress(json.dumps(value).encode())


def _unpack(data: bytes) -> Any:
    return json.loads(zlib.decompress(data).decode())


class NodeRelay(threading.Thread):
    """In the ddpdoctor leading a node: the node's heartbeats, stacks and final evidence, into the
    store; rank 0's requests (stacks, abort, the report is done), back to the node's ranks."""

    def __init__(self, store: Any, *, group: str, rank: int, node: NodeDir, child: SubprocessJob,
                 num_local: int, signals: Optional[StopSignals] = None,
                 on_abort: Optional[Callable[[], None]] = None) -> None:
        super().__init__(name="ddpdoctor-node-relay", daemon=True)
        self.store = store
        self.group = group
        self.rank = rank
        self.node = node
        self.local = FileTransport(node.path)
        self.child = child
        self.num_local = num_local
        self.signals = signals
        self.on_abort = on_abort
        self.aborted = threading.Event()
        self._stop_event = threading.Event()
        self._last_token = ""
        self._seq = 0
        self._signal_sent = False

    def register(self) -> None:
        index = self.store.add("groups", 1) - 1
        self.store.set(f"groups/{index}", self.group)
        self.node.mark_leader()
        sweep_stale(os.path.dirname(self.node.path))

    def run(self) -> None:
        while not self._stop_event.wait(RELAY_PERIOD_S):
            try:
                self.tick()
            except Exception:  # the store went away: the job is ending
                return

    def tick(self) -> None:
        self._pass_signals()
        beats = self.local.heartbeats()
        alive = {r: self.local.alive(b) for r, b in beats.items()}
        self._seq += 1
        self.store.set(f"g/{self.group}/hb", json.dumps(
            {"seq": self._seq, "ranks": {str(r): {**b.to_json(), "alive": alive[r]} for r, b in beats.items()}}))
        if self.store.check(["dump"]):
            token = self.store.get("dump").decode()
            if token != self._last_token:
                self._last_token = token
                live = {r: b for r, b in beats.items() if alive[r]}
                dumps = self.local.request_stacks(live) if live else {}
                self.store.set(f"g/{self.group}/stacks", json.dumps(
                    {"token": token, "stacks": {str(r): d.to_json() for r, d in dumps.items()}}))
        if not self.aborted.is_set() and self.store.check(["abort"]):
            self.aborted.set()
            self.node.abort()  # the node's other ranks stop their ranks (node.LocalPeer)
            if self.on_abort is not None:
                self.on_abort()
            # Every ddpdoctor mutes its rank's output at once and stops the rank a moment later, when
            # all have heard of the abort: a rank stopped first makes its peers print "Connection closed".
            time.sleep(ABORT_GRACE_S)
            self.child.stop()

    def _pass_signals(self) -> None:
        """A stop signal that reached a ddpdoctor of this node (not rank 0's own): rank 0 stops the job."""
        if self._signal_sent:
            return
        found = [s for s in self.node.signals() if s.get("rank") != 0]
        if self.rank != 0 and self.signals is not None and self.signals.received is not None:
            found.append({"signal": self.signals.name, "rank": self.rank, "t": self.signals.received_at})
        if found:
            self._signal_sent = True
            self.store.set("signal", json.dumps(min(found, key=lambda s: s.get("t") or 0)))

    def finish(self, *, exit_code: int, tail: list[str]) -> None:
        """Leave this rank's exit code; once the node's other ranks ended too (relaying meanwhile),
        publish the node's events, exit codes and output tails in one bundle."""
        self.node.write_exit(self.rank, exit_code, tail)
        deadline = time.monotonic() + GATHER_WAIT_S
        quiet_since: Optional[float] = None
        while time.monotonic() < deadline and len(self.node.exits()) < self.num_local:
            now = time.monotonic()
            if any(self.local.alive(b) for b in self.local.heartbeats().values()):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since > QUIET_S:
                break  # no rank of the node runs any more: a ddpdoctor that never wrote its exit is gone
            time.sleep(0.1)
        self._stop_event.set()
        self.join(timeout=5)
        try:
            self._pass_signals()
            self.tick()  # the last heartbeats: "exited"
        except Exception:
            pass
        exits = self.node.exits()
        self.store.set(f"g/{self.group}/final", _pack({
            "events": self.local.collect().processes,
            "exits": {str(r): e.get("code") for r, e in exits.items()},
            "tails": {str(r): e.get("tail") or [] for r, e in exits.items()}}))

    def wait_for_report(self) -> bool:
        """A node other than rank 0's: wait until the report is built, let the node's ranks go, say
        goodbye (the last request: rank 0 may close the store after it), remove the node directory."""
        deadline = time.monotonic() + REPORT_WAIT_S
        reported = False
        while time.monotonic() < deadline:
            try:
                if self.store.check(["reported"]):
                    reported = True
                    break
            except Exception:
                break
            time.sleep(0.2)
        if reported:  # else the node's ranks find the directory gone: no report holds their evidence
            self.node.report_done()
            _wait_for_byes(self.node, self.num_local - 1)
            try:
                self.store.add("goodbyes", 1)
            except Exception:
                pass
        self.node.remove()
        return reported


def _wait_for_byes(node: NodeDir, expected: int) -> None:
    deadline = time.monotonic() + GOODBYE_WAIT_S
    while time.monotonic() < deadline and node.num_byes() < expected:
        time.sleep(0.05)


class StoreTransport:
    """On rank 0: every node's heartbeats, stacks and evidence, read from the store, a key per node."""

    def __init__(self, store: Any, world_size: int, *, num_groups: int, node: Optional[NodeDir] = None,
                 num_local: int = 1) -> None:
        self.store = store
        self.world_size = world_size
        self.num_groups = num_groups  # the nodes (or, without shared node directories, the ranks) expected
        self.node = node  # rank 0's own node: its ranks are let go like any node's
        self.num_local = num_local
        self._groups: list[str] = []
        # group -> (its heartbeat bundle's seq, local time it changed)
        self._bundle_seq: dict[str, tuple[int, float]] = {}
        self._group_of: dict[int, str] = {}
        self._alive: dict[int, bool] = {}
        self._finals: dict[str, dict] = {}
        self._missing: set[int] = set()

    def groups(self) -> list[str]:
        count = int(self.store.add("groups", 0))
        for index in range(len(self._groups), count):
            self._groups.append(self.store.get(f"groups/{index}").decode())
        return self._groups

    def heartbeats(self) -> dict[int, Heartbeat]:
        beats: dict[int, Heartbeat] = {}
        now = time.monotonic()
        for group in self.groups():
            key = f"g/{group}/hb"
            if not self.store.check([key]):
                continue
            bundle = json.loads(self.store.get(key))
            if self._bundle_seq.get(group, (None,))[0] != bundle["seq"]:
                self._bundle_seq[group] = (bundle["seq"], now)
            for rank_text, data in bundle["ranks"].items():
                rank = int(rank_text)
                beats[rank] = Heartbeat.from_json(data)
                self._alive[rank] = bool(data.get("alive", True))
                self._group_of[rank] = group
        return beats

    def alive(self, beat: Heartbeat) -> bool:
        """Running, as the rank's node leader saw it; judged on this machine's clock (the nodes' clocks
        may differ): a bundle that stopped changing for STALE_S means the node's leader is gone."""
        rank = beat.rank if beat.rank is not None else -1
        if beat.activity == "exited" or not self._alive.get(rank, True) or self.exited(rank):
            return False
        changed = self._bundle_seq.get(self._group_of.get(rank, ""))
        return changed is None or time.monotonic() - changed[1] < STALE_S

    def request_stacks(self, ranks: dict[int, Heartbeat], wait_s: float = STACK_WAIT_S) -> dict[int, StackDump]:
        token = uuid.uuid4().hex
        self.store.set("dump", token)
        deadline = time.monotonic() + wait_s + 2 * RELAY_PERIOD_S
        waiting = {self._group_of[r] for r in ranks if r in self._group_of}
        stacks: dict[int, StackDump] = {}
        while time.monotonic() < deadline and waiting:
            for group in sorted(waiting):
                key = f"g/{group}/stacks"
                if not self.store.check([key]):
                    continue
                bundle = json.loads(self.store.get(key))
                if bundle.get("token") != token:
                    continue
                waiting.discard(group)
                for rank_text, data in bundle["stacks"].items():
                    if int(rank_text) in ranks:
                        stacks[int(rank_text)] = StackDump.from_json(data)
            time.sleep(0.05)
        return stacks

    def interrupted(self) -> Optional[tuple[str, float, Optional[int]]]:
        """(signal, wall time, rank) once a ddpdoctor other than rank 0's got a stop signal."""
        if not self.store.check(["signal"]):
            return None
        data = json.loads(self.store.get("signal"))
        return data.get("signal") or "signal", float(data.get("t") or time.time()), data.get("rank")

    def _read_finals(self) -> None:
        for group in self.groups():
            key = f"g/{group}/final"
            if group not in self._finals and self.store.check([key]):
                self._finals[group] = _unpack(self.store.get(key))

    def exited_ranks(self) -> set[int]:
        return {int(r) for final in self._finals.values() for r in final["exits"]}

    def exited(self, rank: int) -> bool:
        return rank in self.exited_ranks()

    def collect(self) -> Collected:
        """Every node's final bundle: events, exit codes, output tails (waiting up to GATHER_WAIT_S
        for nodes that are still finishing)."""
        deadline = time.monotonic() + GATHER_WAIT_S
        while True:
            self._read_finals()
            if len(self.exited_ranks()) >= self.world_size or len(self._finals) >= self.num_groups \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        collected = Collected()
        for group in self._groups:
            final = self._finals.get(group)
            if final is None:
                continue
            collected.processes.extend(final["events"])
            for rank_text, tail in final["tails"].items():
                collected.output_tails[int(rank_text)] = tail
            for rank_text, code in final["exits"].items():
                if code:
                    collected.failures.append(Failure(rank=int(rank_text), exitcode=int(code)))
        exited = self.exited_ranks()
        collected.missing_ranks = [r for r in range(self.world_size) if r not in exited]
        self._missing = set(collected.missing_ranks)
        return collected

    def abort(self, wait_s: float = ABORT_WAIT_S) -> None:
        """Tell every node to stop its ranks, and give them a moment to do so before rank 0 stops its
        own: a rank that outlives rank 0's only prints "Connection closed by peer"."""
        self.store.set("abort", "1")
        if self.node is not None:
            self.node.abort()
        deadline = time.monotonic() + wait_s
        own = self._group_of.get(0)
        while time.monotonic() < deadline:
            self._read_finals()
            if set(self.groups()) - {own} <= set(self._finals):
                return
            time.sleep(0.05)

    def reported(self, wait_s: float = GOODBYE_WAIT_S) -> None:
        """Tell every node the report is built, and wait (briefly) for their goodbyes: a store that
        rank 0 closes under a node's request makes that node print a C++ stack of "Connection was
        likely closed"."""
        self.store.set("reported", "1")
        if self.node is not None:
            self.node.report_done()
            _wait_for_byes(self.node, self.num_local - 1)
        others = [g for g in self._groups if g != self._group_of.get(0) and g in self._finals]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and int(self.store.add("goodbyes", 0)) < len(others):
            time.sleep(0.05)


class WorldJob:
    """Rank 0's view of the whole job: its own rank, and every other one through the store."""

    def __init__(self, child: SubprocessJob, transport: StoreTransport) -> None:
        self.child = child
        self.transport = transport
        self._child_done_at: Optional[float] = None
        self._checked = 0.0

    def finished(self) -> bool:
        if not self.child.finished():
            return False
        now = time.monotonic()
        if self._child_done_at is None:
            self._child_done_at = now
        if now - self._checked < RELAY_PERIOD_S / 2:
            return False
        self._checked = now
        beats = self.transport.heartbeats()
        if any(r != 0 and self.transport.alive(b) for r, b in beats.items()):
            return False  # still watched for hangs by the monitor
        seen = set(beats) | self.transport.exited_ranks()
        return len(seen) >= self.transport.world_size or now - self._child_done_at > GATHER_WAIT_S

    def drain(self) -> list[tuple[int, str]]:
        return self.child.drain()

    def track(self) -> None:
        self.child.track()
