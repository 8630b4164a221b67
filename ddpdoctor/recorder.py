"""The in-rank evidence writer: one JSON line per event, written as it happens.

Each rank process appends to ``events-<pid>.jsonl`` in the evidence directory. Lines are written
unbuffered-by-line so a crash, a SIGKILL or a hang loses nothing already observed. Counters here
(progress, collective sequence, optimizer steps) also feed the heartbeat.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Optional


class Recorder:
    """Per-process event sink and progress counters shared by all probes."""

    def __init__(self, evidence_dir: str, *, fingerprint_every: int = 0) -> None:
        self.evidence_dir = evidence_dir
        self.fingerprint_every = max(0, fingerprint_every)  # 0: the automatic schedule
        self.pid = os.getpid()
        self.rank: Optional[int] = _env_int("RANK")
        self.world_size: Optional[int] = _env_int("WORLD_SIZE")
        self.local_rank: Optional[int] = _env_int("LOCAL_RANK")
        self.node_rank: Optional[int] = _env_int("GROUP_RANK")
        self.agent: Optional[int] = _env_int("DDPDOCTOR_AGENT")  # envvars.AGENT
        self.host = socket.gethostname()
        self.progress = 0  # bumped by every probe callback; a stalled value means a stalled rank
        self.collective_seq = 0
        self.num_steps = 0
        self.epoch: Optional[int] = None
        self.activity = "starting"
        self.activity_site: Optional[dict] = None
        self.on_dump: list = []  # callables run by the watchdog when the supervisor asks for a dump
        self._lock = threading.Lock()
        os.makedirs(evidence_dir, exist_ok=True)
        self._file = open(os.path.join(evidence_dir, f"events-{self.pid}.jsonl"), "a", buffering=1)

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one event; every event carries rank, time, step and collective sequence."""
        record = {
            "kind": kind,
            "t": time.time(),
            "rank": self.rank,
            "step": self.num_steps,
            "seq": self.collective_seq,
            **fields,
        }
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            self.progress += 1
            if not self._file.closed:
                self._file.write(line + "\n")

    def set_activity(self, activity: str, site: Optional[dict] = None) -> None:
        self.activity = activity
        self.activity_site = site
        self.progress += 1

    def heartbeat(self) -> dict:
        return {
            "pid": self.pid,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "node_rank": self.node_rank,
            "agent": self.agent,
            "host": self.host,
            "t": time.time(),
            "progress": self.progress,
            "steps": self.num_steps,
            "epoch": self.epoch,
            "seq": self.collective_seq,
            "activity": self.activity,
            "site": self.activity_site,
        }

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


_RECORDER: Optional[Recorder] = None


def get() -> Optional[Recorder]:
    """The process's recorder, or None when probes are not installed."""
    return _RECORDER


def install(recorder: Recorder) -> None:
    global _RECORDER
    _RECORDER = recorder
