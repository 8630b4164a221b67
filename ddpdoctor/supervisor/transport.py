"""How the monitor reaches the ranks: heartbeats, stack dumps on request, and the evidence.

One small interface, two transports: files in an evidence directory beside a job ddpdoctor
launched (this module), and the job's c10d store inside an existing launch (:mod:`.store`).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ddpdoctor.schema import dump_request, layout
from ddpdoctor.schema.observations import Failure, Heartbeat, StackDump
from ddpdoctor.supervisor import processes

STACK_WAIT_S = 2.0


@dataclass
class Collected:
    """What a transport gathered at the end: each process's raw event lines, and what the ranks'
    own supervisors reported (inside an existing launch)."""

    processes: list[list[str]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    output_tails: dict[int, list[str]] = field(default_factory=dict)
    missing_ranks: list[int] = field(default_factory=list)
    launcher_log: list[str] = field(default_factory=list)  # torchrun's own log lines (supervisor/job_output.py)


class Transport(Protocol):
    def heartbeats(self) -> dict[int, Heartbeat]:
        """The newest heartbeat of every rank that has written one."""

    def alive(self, beat: Heartbeat) -> bool:
        """Whether the rank behind ``beat`` is still running."""

    def request_stacks(self, ranks: dict[int, Heartbeat], wait_s: float = STACK_WAIT_S) -> dict[int, StackDump]:
        """Ask ``ranks`` for their main thread's stack (and to flush open evidence); wait up to ``wait_s``."""

    def collect(self) -> Collected:
        """Every process's events, once the job is over."""


def read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class FileTransport:
    """The evidence directory of a job on this machine: heartbeat, stack and event files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def heartbeats(self) -> dict[int, Heartbeat]:
        beats: dict[int, Heartbeat] = {}
        for path in glob.glob(os.path.join(self.directory, f"{layout.HEARTBEAT_PREFIX}*.json")):
            data = read_json(path)
            if not data or data.get("rank") is None:
                continue
            beat = Heartbeat.from_json(data)
            previous = beats.get(beat.rank)
            if previous is None or beat.t >= previous.t:
                beats[beat.rank] = beat
        return beats

    def alive(self, beat: Heartbeat) -> bool:
        return beat.activity != "exited" and processes.alive(beat.pid)

    def request_stacks(self, ranks: dict[int, Heartbeat], wait_s: float = STACK_WAIT_S) -> dict[int, StackDump]:
        answers = dump_request.request_dumps(self.directory, [beat.pid for beat in ranks.values()], wait_s)
        return {rank: StackDump.from_json(answers[beat.pid]) for rank, beat in ranks.items() if beat.pid in answers}

    def collect(self) -> Collected:
        found = []
        for path in sorted(glob.glob(os.path.join(self.directory, layout.EVENTS_GLOB))):
            with open(path, errors="replace") as f:
                found.append(f.read().splitlines())
        return Collected(processes=found)
