"""Evidence: every rank's events plus what the supervisor saw, loaded into one immutable view.

Analyzers read this and nothing else. Loading is the only I/O; everything after is pure.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional


@dataclass
class RankEvidence:
    """Events of one rank process, in the order it wrote them."""

    rank: int
    events: list[dict] = field(default_factory=list)
    pid: Optional[int] = None
    host: Optional[str] = None
    node_rank: Optional[int] = None
    local_rank: Optional[int] = None

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("kind") == kind]

    def first(self, kind: str) -> Optional[dict]:
        return next((e for e in self.events if e.get("kind") == kind), None)


@dataclass
class Evidence:
    """All ranks' evidence and the supervisor's observations.

    ``failures`` come from torchrun (rank, exitcode, signal); ``hang`` is set when the supervisor
    stopped a stalled job and holds heartbeats and stacks per rank.
    """

    ranks: dict[int, RankEvidence] = field(default_factory=dict)
    world_size: int = 0
    nnodes: int = 1
    outcome: str = "completed"
    script: Optional[str] = None
    unranked: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    hang: Optional[dict] = None
    timeout_s: Optional[float] = None
    interrupted: bool = False

    @property
    def stopped_by_ddpdoctor(self) -> bool:
        """True when ddpdoctor itself stopped the job (hang, --timeout, Ctrl-C): exits then are ours."""
        return self.outcome in ("hung", "timeout") or self.interrupted

    def events(self, kind: str) -> Iterator[tuple[int, dict]]:
        """(rank, event) for every event of ``kind``, rank by rank."""
        for rank in sorted(self.ranks):
            for event in self.ranks[rank].of(kind):
                yield rank, event

    def any(self, kind: str) -> bool:
        return any(True for _ in self.events(kind))


def read_events(path: str) -> list[dict]:
    """Events of one file; a line torn by a kill at write time is skipped."""
    events = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _rank_of(events: list[dict]) -> Optional[int]:
    for e in events:
        if e.get("kind") == "init_pg" and e.get("rank") is not None:
            return int(e["rank"])
    ranks = [e["rank"] for e in events if e.get("rank") is not None]
    return int(ranks[-1]) if ranks else None


def _fill_identity(ev: RankEvidence) -> None:
    for e in ev.events:
        if e.get("kind") in ("init_pg", "process_start"):
            ev.pid = e.get("pid", ev.pid)
            ev.host = e.get("host", ev.host)
            if e.get("node_rank") is not None:
                ev.node_rank = e["node_rank"]
            if e.get("local_rank") is not None:
                ev.local_rank = e["local_rank"]


def load_dir(evidence_dir: str, **supervisor: Any) -> Evidence:
    """Evidence of every process that wrote into ``evidence_dir``, plus the supervisor's fields."""
    evidence = Evidence(**supervisor)
    for path in sorted(glob.glob(os.path.join(evidence_dir, "events-*.jsonl"))):
        events = read_events(path)
        rank = _rank_of(events)
        if rank is None:
            evidence.unranked.extend(events)
            continue
        for e in events:
            e["rank"] = rank
        ev = evidence.ranks.setdefault(rank, RankEvidence(rank=rank))
        ev.events.extend(events)
        _fill_identity(ev)
    if not evidence.world_size:
        sizes = [e.get("world_size") for _, e in evidence.events("init_pg")]
        evidence.world_size = max([s for s in sizes if s] or [len(evidence.ranks)])
    return evidence
