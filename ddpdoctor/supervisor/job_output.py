"""Rank output: each line attributed to its global rank, shown once with a ``[rankN]`` prefix, and
the last lines of every rank kept, since NCCL writes some causes only there.

torchrun's own log lines (``E1124 12:00:01.000000 123 torch/distributed/elastic/...] failed``) are
not the script's output: they are kept apart for the report and its log file, never shown among the
script's lines. ddpdoctor reports what they say (exit codes, signals) in its own words.
"""

from __future__ import annotations

import collections
import re
from typing import Optional, Protocol

from ddpdoctor.schema.observations import Heartbeat

TAIL_LINES = 200
LAUNCHER_LINES = 500
_TEE_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:(.*)$", re.S)  # torchrun --tee: "[default0]:line"
_EXCEPTHOOK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")  # torch's excepthook: "[rank1]: Traceback ..."
# torch.distributed.elastic's log format: level letter, date, time, pid, torch path:line] message.
_LAUNCHER_LOG = re.compile(r"^[DIWEFC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "
                           r"\S*torch/distributed/(?:elastic|run|launcher)\S*:\d+\] ")
# "failed (exitcode: -6) local_rank: 0 (pid: 6917) of binary: ...": how a rank's process ended.
_AGENT_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


def is_launcher_log(line: str) -> bool:
    """Whether ``line`` is torchrun's own logging (not the script's output)."""
    return bool(_LAUNCHER_LOG.match(line))


class OutputSink(Protocol):
    def output(self, rank: Optional[int], line: str) -> None: ...

    # Optional: ``launcher(line)`` receives torchrun's log lines, ``exited(pid, exitcode)`` how a
    # rank process ended as torchrun saw it (a sink without them gets neither).


class OutputRouter:
    """Maps (agent, torchrun's local prefix) to global ranks through the ranks' heartbeats."""

    def __init__(self, sink: OutputSink, *, nproc_per_node: int, fixed_rank: Optional[int] = None) -> None:
        self.sink = sink
        self.nproc_per_node = nproc_per_node
        self.fixed_rank = fixed_rank
        self.tails: dict[int, collections.deque] = {}
        self.launcher_log: collections.deque = collections.deque(maxlen=LAUNCHER_LINES)
        self._rank_of: dict[tuple[int, int], int] = {}
        self.muted = False  # set once ddpdoctor stops the job on a signal: what ranks print then is the stop's doing

    def learn(self, beats: dict[int, Heartbeat]) -> None:
        for rank, beat in beats.items():
            if beat.agent is not None and beat.local_rank is not None:
                self._rank_of[(beat.agent, beat.local_rank)] = rank

    def route(self, lines: list[tuple[int, str]]) -> None:
        for agent, line in lines:
            if is_launcher_log(line):
                self._launcher(line)
                continue
            rank: Optional[int] = self.fixed_rank
            if rank is None:
                match = _TEE_PREFIX.match(line)
                if match:
                    local = int(match.group(1))
                    rank = self._rank_of.get((agent, local), agent * self.nproc_per_node + local)
                    line = match.group(2)
            if rank is not None:
                hook = _EXCEPTHOOK_PREFIX.match(line)
                if hook and int(hook.group(1)) == rank:
                    line = line[hook.end():]
                self.tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES)).append(line)
            if not self.muted:
                self.sink.output(rank, line)

    def _launcher(self, line: str) -> None:
        self.launcher_log.append(line)
        sink_launcher = getattr(self.sink, "launcher", None)
        if sink_launcher is not None:
            sink_launcher(line)
        failure = _AGENT_FAILURE.search(line)
        sink_exited = getattr(self.sink, "exited", None)
        if failure and sink_exited is not None:
            sink_exited(int(failure.group(3)), int(failure.group(1)))

    def launcher_lines(self) -> list[str]:
        return list(self.launcher_log)

    def tail_lists(self) -> dict[int, list[str]]:
        return {rank: list(lines) for rank, lines in self.tails.items()}
