"""Rank output: each line attributed to its global rank, shown once with a ``[rankN]`` prefix, and
the last lines of every rank kept, since NCCL writes some causes only there."""

from __future__ import annotations

import collections
import re
from typing import Optional, Protocol

from ddpdoctor.schema.observations import Heartbeat

TAIL_LINES = 200
_TEE_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:(.*)$", re.S)  # torchrun --tee: "[default0]:line"
_EXCEPTHOOK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")  # torch's excepthook: "[rank1]: Traceback ..."


class OutputSink(Protocol):
    def output(self, rank: Optional[int], line: str) -> None: ...


class OutputRouter:
    """Maps (agent, torchrun's local prefix) to global ranks through the ranks' heartbeats."""

    def __init__(self, sink: OutputSink, *, nproc_per_node: int, fixed_rank: Optional[int] = None) -> None:
        self.sink = sink
        self.nproc_per_node = nproc_per_node
        self.fixed_rank = fixed_rank
        self.tails: dict[int, collections.deque] = {}
        self._rank_of: dict[tuple[int, int], int] = {}
        self.muted = False  # set once ddpdoctor stops the job on a signal: what ranks print then is the stop's doing

    def learn(self, beats: dict[int, Heartbeat]) -> None:
        for rank, beat in beats.items():
            if beat.agent is not None and beat.local_rank is not None:
                self._rank_of[(beat.agent, beat.local_rank)] = rank

    def route(self, lines: list[tuple[int, str]]) -> None:
        for agent, line in lines:
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

    def tail_lists(self) -> dict[int, list[str]]:
        return {rank: list(lines) for rank, lines in self.tails.items()}
