"""Evidence: every rank's typed events plus what the supervisor observed, in one view.

Analyzers read this and nothing else. Loading is the only I/O; everything after is pure. Facts
derived from it (:mod:`ddpdoctor.analysis.facts`) are computed once, on first use, and kept in its
``derived`` field, of which this module knows nothing more.
"""

from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar, Union

from ddpdoctor.schema.events import Event, InitProcessGroup, ProcessStart, Step, event_from_json
from ddpdoctor.schema.fingerprints import intern
from ddpdoctor.schema.observations import Failure, Observations, StopSnapshot

E = TypeVar("E", bound=Event)

POST_MORTEM = "post-mortem"  # the launch mode of evidence read back from a job's files by `ddpdoctor analyze`


@dataclass
class RankEvidence:
    """Events of one rank, in the order its processes wrote them."""

    rank: int
    events: list[Event] = field(default_factory=list)
    pid: Optional[int] = None
    host: Optional[str] = None
    node_rank: Optional[int] = None
    local_rank: Optional[int] = None

    def __post_init__(self) -> None:
        self._by_kind: Optional[dict[type, list[Event]]] = None

    def of(self, kind: type[E]) -> list[E]:
        if self._by_kind is None:
            self._by_kind = {}
            for event in self.events:
                self._by_kind.setdefault(type(event), []).append(event)
        return self._by_kind.get(kind, [])  # type: ignore[return-value]

    def first(self, kind: type[E]) -> Optional[E]:
        found = self.of(kind)
        return found[0] if found else None

    def fill_identity(self) -> None:
        for event in self.events:
            if isinstance(event, (InitProcessGroup, ProcessStart)):
                self.pid = event.pid or self.pid
                self.host = event.host or self.host
                if event.node_rank is not None:
                    self.node_rank = event.node_rank
                if event.local_rank is not None:
                    self.local_rank = event.local_rank


@dataclass
class Evidence:
    """All ranks' evidence and the supervisor's observations."""

    ranks: dict[int, RankEvidence] = field(default_factory=dict)
    unranked: list[Event] = field(default_factory=list)  # processes that never had a rank (a spawn launcher)
    observations: Observations = field(default_factory=Observations)
    script: Optional[str] = None
    # facts derived from this evidence, each computed once: filled and cleared by ddpdoctor.analysis.facts.derived
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return self.observations.world_size

    @property
    def outcome(self) -> str:
        return self.observations.outcome

    @property
    def nnodes(self) -> int:
        return self.observations.nnodes

    @property
    def failures(self) -> list[Failure]:
        return self.observations.failures

    @property
    def stop(self) -> Optional[StopSnapshot]:
        return self.observations.stop

    @property
    def post_mortem(self) -> bool:
        """Read back from the files a job left (flight recorder dumps, torchrun's error files and logs)
        by ``ddpdoctor analyze``, not watched by the probes: only what those files say is known."""
        return self.observations.launch_mode == POST_MORTEM

    @property
    def counts_steps(self) -> bool:
        """Whether the events' ``step`` is a count: ddpdoctor's optimizer probe counts every rank's steps
        in a live run, while a post-mortem's files hold no step at all, so there the events' 0 means
        unknown, never "before the first step"."""
        return not self.post_mortem

    @property
    def stopped_by_ddpdoctor(self) -> bool:
        """True when ddpdoctor itself stopped the job (hang, --timeout, Ctrl-C): exits then are ours."""
        return self.stop is not None

    def events(self, kind: type[E]) -> Iterator[tuple[int, E]]:
        """(rank, event) for every event of ``kind``, rank by rank."""
        for rank in sorted(self.ranks):
            for event in self.ranks[rank].of(kind):
                yield rank, event

    def any(self, kind: type[E]) -> bool:
        return any(True for _ in self.events(kind))

    @classmethod
    def from_processes(cls, processes: Iterable[list[Event]], *, observations: Observations,
                       script: Optional[str] = None) -> "Evidence":
        """Evidence from the event lists of every process (one list per process, in write order)."""
        evidence = cls(observations=observations, script=script)
        for events in processes:
            rank = _rank_of(events)
            if rank is None:
                evidence.unranked.extend(events)
                continue
            for event in events:
                event.rank = rank
            ev = evidence.ranks.setdefault(rank, RankEvidence(rank=rank))
            ev.events.extend(events)
            ev.fill_identity()
        if not observations.world_size:
            sizes = [e.world_size for _, e in evidence.events(InitProcessGroup) if e.world_size]
            observations.world_size = max(sizes or [len(evidence.ranks)])
        return evidence


def _rank_of(events: list[Event]) -> Optional[int]:
    for e in events:
        if isinstance(e, InitProcessGroup) and e.rank is not None:
            return int(e.rank)
    ranks = [e.rank for e in events if e.rank is not None]
    return int(ranks[-1]) if ranks else None


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: evidence is millions of small containers without
    cycles, and each collection walks all of them (at a thousand ranks, most of the reading time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_lines(lines: Iterable[str], pool: Optional[dict[str, str]] = None) -> list[Event]:
    """Typed events of one process's JSON lines; a line torn by a kill at write time is skipped.

    Pass the same ``pool`` for every process of a job: equal step fingerprints are then stored
    once, which is what keeps the evidence of a thousand ranks in memory at all. A process's lines
    are parsed as one JSON array (one call into orjson), line by line only when one of them is torn.
    """
    pool = {} if pool is None else pool
    lines = list(lines)
    try:
        parsed = _loads("[" + ",".join(line for line in lines if line.strip()) + "]")
    except ValueError:  # a torn line (the process was killed while writing): keep the others
        parsed = []
        for line in lines:
            try:
                parsed.append(_loads(line))
            except ValueError:
                continue
    events = []
    for data in parsed:
        if not isinstance(data, dict):
            continue
        try:
            event = event_from_json(data, owned=True)
        except (TypeError, ValueError):
            continue
        if isinstance(event, Step):
            event.grads, event.params = intern(event.grads, pool), intern(event.params, pool)
            event.config = intern(event.config, pool)
        events.append(event)
    return events


_loads: Callable[[Union[str, bytes]], Any]
try:
    from orjson import loads as _loads  # several times faster than the standard library on evidence
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library still works
    _loads = json.loads
