"""One node of an existing launch: its ranks' ddpdoctors share a directory, one of them talks to the store.

Under torchrun or a Slurm step, the ranks of a node are siblings (children of one agent, or of one
slurmstepd). Their ddpdoctor processes share a node directory, named after that parent process, in
which every rank writes its heartbeats, stacks and events (the rank side's file channel, as in any
launch) and every rank's ddpdoctor writes its exit code and output tail. The ddpdoctor of local
rank 0 leads the node: it alone imports torch and connects to the job's store, relays the node's
files to rank 0 in one bundle per node (store.py), and passes rank 0's requests back as files:
``abort`` (stop your rank), ``reported`` (the report holds your evidence: exit). The others
(:class:`LocalPeer`) never import torch, which is what a second process per rank would cost.

Under any other launcher (RANK and WORLD_SIZE set by hand, ``bash -c`` wrappers) ranks need not
share a parent, so every rank is a node of its own with a private directory; also with
``DDPDOCTOR_NODE_GROUPS=0``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Callable, Optional

from ddpdoctor.supervisor import processes
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import read_json, write_atomic

NODE_GROUPS = "DDPDOCTOR_NODE_GROUPS"  # "0": every rank relays for itself
LEADER_WAIT_S = 60.0  # how long a rank waits for its node's leader before it says it found none
POLL_S = 0.2
_EXIT = re.compile(r"exit-(\d+)\.json$")


def shared_directory(*, detected: str, run_id: str, node_rank: int, env: dict = os.environ) -> Optional[str]:
    """The node directory every rank of this node computes alike, or None where ranks may not share it.

    Named after the parent process (pid and start time: unique, never reused for a later launch)."""
    if detected not in ("torchrun", "slurm") or env.get(NODE_GROUPS) == "0":
        return None
    parent = os.getppid()
    start = processes.start_time(parent)
    if start is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:40]
    return os.path.join(tempfile.gettempdir(), f"ddpdoctor-node-{safe}-{node_rank}-{parent}-{start}")


def sweep_stale(directory: str = "") -> None:
    """Remove node directories of launches whose parent process is gone (a leader that was killed
    before it could clean up): their names end in the parent's pid and start time."""
    for path in glob.glob(os.path.join(directory or tempfile.gettempdir(), "ddpdoctor-node-*")):
        parts = os.path.basename(path).rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() \
                and not processes.alive(int(parts[1]), int(parts[2])):
            shutil.rmtree(path, ignore_errors=True)


class NodeDir:
    """The supervisor-level files of a node directory (the ranks' own files are schema/layout.py's)."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # -- the leader --------------------------------------------------------------------------------
    def mark_leader(self) -> None:
        write_atomic(self._file("leader.json"), json.dumps({"pid": os.getpid(), "t": time.time()}))

    def leader_pid(self) -> Optional[int]:
        data = read_json(self._file("leader.json"))
        return int(data["pid"]) if data and data.get("pid") else None

    def abort(self) -> None:
        write_atomic(self._file("abort"), "1")

    def aborted(self) -> bool:
        return os.path.exists(self._file("abort"))

    def report_done(self) -> None:
        write_atomic(self._file("reported"), "1")

    def reported(self) -> bool:
        return os.path.exists(self._file("reported"))

    # -- every rank's ddpdoctor ----------------------------------------------------------------------
    def write_exit(self, rank: int, code: int, tail: list[str]) -> None:
        write_atomic(self._file(f"exit-{rank}.json"), json.dumps({"rank": rank, "code": code, "tail": tail}))

    def exits(self) -> dict[int, dict]:
        found = {}
        for path in glob.glob(self._file("exit-*.json")):
            match = _EXIT.search(path)
            data = read_json(path)
            if match and data is not None:
                found[int(match.group(1))] = data
        return found

    def write_signal(self, rank: int, name: str, t: float) -> None:
        write_atomic(self._file(f"signal-{rank}.json"), json.dumps({"signal": name, "rank": rank, "t": t}))

    def signals(self) -> list[dict]:
        return [d for d in (read_json(p) for p in glob.glob(self._file("signal-*.json"))) if d]

    def bye(self, rank: int) -> None:
        write_atomic(self._file(f"bye-{rank}"), "1")

    def num_byes(self) -> int:
        return len(glob.glob(self._file("bye-*")))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class LocalPeer(threading.Thread):
    """A non-leading rank's ddpdoctor: stops its rank when the leader says so, passes its stop
    signal on, and once its rank ended leaves the exit code and waits for the report. No torch."""

    def __init__(self, node: NodeDir, rank: int, *, stop_rank: Callable[[], None], mute: Callable[[], None],
                 signals: Optional[StopSignals] = None, notice: Callable[[str], None] = lambda text: None,
                 grace_s: float = 1.5) -> None:
        super().__init__(name="ddpdoctor-local-peer", daemon=True)
        self.node = node
        self.rank = rank
        self.stop_rank = stop_rank
        self.mute = mute
        self.grace_s = grace_s
        self.signals = signals
        self.notice = notice
        self._finished = threading.Event()
        self._signal_sent = False
        self._began_at = time.monotonic()
        self._warned = False

    def run(self) -> None:
        while not self._finished.wait(POLL_S):
            self._pass_signal()
            if self.node.aborted():  # mute now, stop once every ddpdoctor of the job heard of it (store.ABORT_GRACE_S)
                self.mute()
                self._finished.wait(self.grace_s)
                self.stop_rank()
                return
            if (not self._warned and self.node.leader_pid() is None
                    and time.monotonic() - self._began_at > LEADER_WAIT_S):
                self._warned = True
                self.notice(f"rank {self.rank} found no ddpdoctor of local rank 0 in {self.node.path} (a launcher "
                            f"that does not start the ranks of a node from one process?); set {NODE_GROUPS}=0 so "
                            "that every rank relays its own evidence")

    def _pass_signal(self) -> None:
        if self._signal_sent or self.signals is None or self.signals.received is None:
            return
        self._signal_sent = True
        self.node.write_signal(self.rank, self.signals.name or "", self.signals.received_at)

    def finish(self, *, exit_code: int, tail: list[str]) -> None:
        self._finished.set()
        self._pass_signal()
        self.node.write_exit(self.rank, exit_code, tail)

    def wait_for_report(self, timeout_s: float) -> bool:
        """True once rank 0's report holds this rank's evidence; False if the leader is gone or it took too long."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.node.reported():
                self.node.bye(self.rank)
                return True
            leader = self.node.leader_pid()
            if leader is not None and not processes.alive(leader):
                return False
            if not os.path.isdir(self.node.path):
                return False
            time.sleep(POLL_S)
        return False
