"""Each rank's sequence of world-group collectives, DDP's own included, and where the ranks part.

A rank's trace holds its traced calls (:class:`Collective`) and the collectives libraries issued for
it (:class:`InternalCollectives`: DDP's constructor, forward and backward), each at its number in
the process group's numbering. Ranks are compared number by number: the collective a rank issued
as its n-th is paired by the backend with every other rank's n-th, whatever each meant by it. The
first number at which the ranks' collectives differ is where the job went wrong, even when no hang
followed (a rank-0-only DDP forward broadcasts buffers that the other ranks pair with their own
training collectives: they mix silently until one of them waits for good).

Pure: no torch, no processes. The same code runs on live evidence and on evidence converted from
flight-recorder dumps.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from ddpdoctor.schema.events import Collective, Event, InitProcessGroup, InternalCollectives, InternalPhase, Site

__all__ = ["POINT_TO_POINT", "SHAPE_FREE", "ROOT_LISTS", "TraceEntry", "Mismatch", "call_signature",
           "rank_trace", "trace_of", "first_mismatch", "PHASE_WHAT", "PHASE_PART_OF", "subgroup_traces",
           "first_subgroup_mismatch"]

POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# Collectives whose tensor arguments may legitimately differ by rank: only the op is compared.
SHAPE_FREE = frozenset({"all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "new_group",
                        "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"})
# Collectives with a list argument only the root rank passes: only the first tensor is compared.
ROOT_LISTS = frozenset({"gather", "scatter"})

# What a library's collectives were, by phase, in words; what a library's traced call was part of.
PHASE_WHAT = {phase.value: phase.what for phase in InternalPhase}
PHASE_PART_OF = {phase.value: phase.part_of for phase in InternalPhase}

# What ranks compare a collective by: a traced call's signature (call_signature), a library run's
# (phase, grad, op).
Signature = tuple[Any, ...]
# Where a collective came from (TraceEntry.line_key): (phase, op, file, line, grad).
LineKey = tuple[str, str, Optional[str], Optional[int], Optional[bool]]


def call_signature(event: Collective) -> Signature:
    """What must be equal across ranks for a traced call at the same number."""
    if event.op in SHAPE_FREE:
        return ("call", event.op)
    tensors = event.tensors[:1] if event.op in ROOT_LISTS else event.tensors
    return ("call", event.op, repr(tensors))  # shapes and dtypes as JSON gave them: one C call per event


@dataclass(slots=True)  # not frozen: a thousand ranks make millions, and a frozen __init__ costs 3x
class TraceEntry:
    """One numbered collective of one rank: a traced call, or one of a library's collectives."""

    n: int
    event: Union[Collective, InternalCollectives]
    op: str  # the call's op; for a library's collective the op where known, else ""

    @property
    def internal(self) -> bool:
        return isinstance(self.event, InternalCollectives)

    @property
    def phase(self) -> str:
        """A library's phase (FSDP's traced calls included), "call" for the script's own call."""
        return self.event.phase or "call"

    @property
    def site(self) -> Site:
        return self.event.site

    @property
    def t(self) -> float:
        return self.event.t

    @property
    def tensors(self) -> list[list[Any]]:
        return self.event.tensors if isinstance(self.event, Collective) else []

    @property
    def rank_branch(self) -> bool:
        return isinstance(self.event, Collective) and self.event.rank_branch

    @property
    def grad(self) -> Optional[bool]:
        return self.event.grad if isinstance(self.event, InternalCollectives) else None

    def line_key(self) -> LineKey:
        """Where it came from, for counting how often each rank issued collectives from there."""
        first = self.site[0] if self.site else {}
        return (self.phase, self.op if not self.internal else "", first.get("file"), first.get("line"), self.grad)

    def describe(self) -> str:
        """"all_reduce of float32[4]", "all_gather_single of float32[544] in FSDP's forward" or "DDP's
        forward (buffer broadcast, no grad)"."""
        if not self.internal:
            gathers = ("all_gather", "all_gather_into_tensor", "all_gather_single")
            shown = self.tensors[-1] if self.op in gathers and self.tensors else \
                (self.tensors[0] if self.tensors else None)
            part_of = PHASE_PART_OF.get(self.phase)
            return f"{self.op}{f' of {shown[1]}{shown[0]}' if shown else ''}{f' in {part_of}' if part_of else ''}"
        what = PHASE_WHAT.get(self.phase, InternalPhase.OTHER.what)
        if self.op:
            what = f"{self.op} in {what}" if self.phase != InternalPhase.OTHER else self.op
        if self.phase == InternalPhase.DDP_FORWARD and self.grad is False:
            what += ", with no backward to follow (evaluation)"
        return what


def _matches(a: TraceEntry, b: TraceEntry) -> bool:
    """Whether two ranks' collectives at the same number are the same collective."""
    if a.internal != b.internal:
        return False
    if not a.internal:
        return call_signature(a.event) == call_signature(b.event)  # type: ignore[arg-type]
    if a.op and b.op and a.op != b.op:  # both known from a dump
        return False
    if "other" in (a.phase, b.phase):  # Join's shadow collectives, libraries: only their count is known
        return True
    if a.phase != b.phase:
        return False
    return a.grad is None or b.grad is None or a.grad == b.grad


@dataclass
class RankTrace:
    """A rank's numbered world-group collectives (in order) and how far its numbering went."""

    entries: list[TraceEntry] = field(default_factory=list)
    by_n: dict[int, TraceEntry] = field(default_factory=dict)
    numbered_to: int = 0  # collectives the rank issued (a call's later units included)
    numbering: str = "calls"

    @functools.cached_property
    def keys(self) -> tuple[tuple[int, Signature], ...]:
        """(n, key) of every entry: equal for two ranks that issued the same collectives (the converse
        needs :func:`_matches`). The key: a library run's phase, gradient and op; a call's signature,
        computed once per distinct op and tensor list: a thousand ranks hold millions of entries."""
        signatures: dict[tuple[str, int], Signature] = {}
        out: list[tuple[int, Signature]] = []
        for entry in self.entries:
            event = entry.event
            if isinstance(event, InternalCollectives):
                out.append((entry.n, (event.phase, event.grad, entry.op)))
                continue
            cached = (event.op, id(event.tensors))  # the events hold their tensor lists alive meanwhile
            signature = signatures.get(cached)
            if signature is None:
                signature = signatures[cached] = call_signature(event)
            out.append((entry.n, signature))
        return tuple(out)


def rank_trace(events: Iterable[Event]) -> RankTrace:
    """The world-group collectives of one rank's events."""
    collectives: list[Collective] = []
    internals: list[InternalCollectives] = []
    numbering = "calls"
    for event in events:
        if isinstance(event, Collective):
            collectives.append(event)
        elif isinstance(event, InternalCollectives):
            internals.append(event)
        elif isinstance(event, InitProcessGroup):
            numbering = event.numbering
    return trace_of(collectives, internals, numbering)


def trace_of(collectives: Iterable[Collective], internals: Iterable[InternalCollectives],
             numbering: str = "calls") -> RankTrace:
    """A rank's trace from its traced calls and its libraries' collectives."""
    trace = RankTrace(numbering=numbering)
    entries, by_n = trace.entries, trace.by_n
    numbered_to = 0
    for event in collectives:
        if event.group is not None or event.op in POINT_TO_POINT or event.units == 0:
            continue
        entry = TraceEntry(event.n, event, event.op)
        entries.append(entry)
        by_n[event.n] = entry
        numbered_to = max(numbered_to, event.n + max(event.units, 1) - 1)
    for internal in internals:
        if internal.group is not None:
            continue
        ops = internal.ops
        for i in range(internal.count):
            n = internal.first + i
            entry = TraceEntry(n, internal, ops[i][0] if i < len(ops) and ops[i] else "")
            entries.append(entry)
            by_n[n] = entry
        numbered_to = max(numbered_to, internal.first + internal.count - 1)
    trace.numbered_to = numbered_to
    entries.sort(key=lambda e: e.n)
    return trace


@dataclass(frozen=True)
class Mismatch:
    """The first number at which the ranks' world-group collectives differ."""

    n: int
    calls: dict[int, Optional[TraceEntry]]  # None where the rank never issued a collective with this number
    counts: dict[int, Counter[LineKey]] = field(default_factory=dict)  # line_key over the rank's whole trace
    group: Optional[tuple[int, ...]] = None  # a subgroup's global ranks; None: the world group

    @property
    def present(self) -> dict[int, TraceEntry]:
        return {r: e for r, e in self.calls.items() if e is not None}

    @property
    def absent(self) -> list[int]:
        return sorted(r for r, e in self.calls.items() if e is None)

    def _line_counts(self, entry: TraceEntry) -> set[int]:
        """How often the ranks issued collectives from this collective's line: each distinct Counter
        once (ranks that issued the same share one), 0 for a rank without any."""
        key = entry.line_key()
        distinct = {id(c): c for c in self.counts.values()}.values()
        found = {c[key] for c in distinct}
        return found | {0} if any(r not in self.counts for r in self.calls) else found

    def only_some_ranks(self, entry: TraceEntry) -> bool:
        """Whether the line this collective came from issued collectives on some ranks only."""
        return 0 in self._line_counts(entry)

    def uneven(self, entry: TraceEntry) -> bool:
        return len(self._line_counts(entry)) > 1

    def culprit(self) -> int:
        """The rank whose collective to point at: one from a line only some ranks ran (rank-only
        code), then one that ran more often on some ranks, one made inside a rank-dependent branch
        (`if rank == 0:`), a traced call rather than a library's, and finally the earliest."""
        present = self.present
        return min(present, key=lambda r: (not self.only_some_ranks(present[r]), not self.uneven(present[r]),
                                           not present[r].rank_branch, present[r].internal, present[r].t))


def first_mismatch(traces: dict[int, RankTrace], *, include_missing: bool) -> Optional[Mismatch]:
    """The first number at which two ranks' collectives differ; with ``include_missing``, a number
    some ranks reached and others never did counts too. None when every rank issued the same."""
    if len(traces) < 2:
        return None
    reference = next(iter(traces.values())).keys
    if all(t.keys == reference for t in traces.values()):
        return None  # every rank issued the same, the common case: compared as whole sequences
    # Ranks that issued exactly the same are compared once, through the first of them: on a thousand
    # ranks, a handful of distinct sequences.
    classes: dict[tuple[tuple[tuple[int, Signature], ...], int], list[int]] = {}
    for rank, trace in traces.items():
        classes.setdefault((trace.keys, trace.numbered_to), []).append(rank)
    mismatch = _first_mismatch_of({members[0]: traces[members[0]] for members in classes.values()},
                                  include_missing=include_missing)
    if mismatch is None:
        return None
    counts: dict[int, Counter[LineKey]] = {}
    for members in classes.values():
        shared = mismatch.counts[members[0]]
        counts.update((r, shared) for r in members)
    return Mismatch(n=mismatch.n, calls={r: t.by_n.get(mismatch.n) for r, t in traces.items()}, counts=counts)


def _first_mismatch_of(traces: dict[int, RankTrace], *, include_missing: bool) -> Optional[Mismatch]:
    numbers = sorted({e.n for t in traces.values() for e in t.entries})
    ends = {r: t.numbered_to for r, t in traces.items()}
    limit = max(ends.values(), default=0) if include_missing else min(ends.values(), default=0)
    for n in numbers:
        if n > limit:
            break
        calls: dict[int, Optional[TraceEntry]] = {}
        skip = False
        for rank, trace in traces.items():
            entry = trace.by_n.get(n)
            if entry is None and n <= trace.numbered_to:
                skip = True  # inside a call that issued several collectives on this rank: compared at its start
                break
            calls[rank] = entry
        if skip:
            continue
        present = [e for e in calls.values() if e is not None]
        if not present:
            continue
        absent = len(present) < len(calls)
        reference = present[0]
        if (absent and include_missing) or any(not _matches(reference, e) for e in present[1:]):
            counts = {r: Counter(e.line_key() for e in t.entries) for r, t in traces.items()}
            return Mismatch(n=n, calls=calls, counts=counts)
    return None


def subgroup_traces(events_by_rank: dict[int, Iterable[Event]]) -> dict[tuple[int, ...], dict[int, RankTrace]]:
    """Each subgroup's traced calls, per member rank, numbered by the group's own sequence
    (``Collective.n`` of a subgroup call): subgroup -> rank -> trace."""
    out: dict[tuple[int, ...], dict[int, RankTrace]] = {}
    for rank, events in events_by_rank.items():
        for event in events:
            if not isinstance(event, Collective) or not isinstance(event.group, (list, tuple)) or not event.group \
                    or event.op in POINT_TO_POINT or event.units == 0:
                continue
            trace = out.setdefault(tuple(event.group), {}).setdefault(rank, RankTrace(numbering="group"))
            entry = TraceEntry(event.n, event, event.op)
            trace.entries.append(entry)
            trace.by_n[event.n] = entry
            trace.numbered_to = max(trace.numbered_to, event.n + max(event.units, 1) - 1)
    return out


def first_subgroup_mismatch(groups: dict[tuple[int, ...], dict[int, RankTrace]]) -> Optional[Mismatch]:
    """The earliest (by time) call at which a subgroup's members issued different collectives or
    shapes; members that never reached it are not a mismatch here (they may wait elsewhere)."""
    found = []
    for group, traces in groups.items():
        mismatch = first_mismatch(traces, include_missing=False)
        if mismatch is not None:
            found.append(Mismatch(n=mismatch.n, calls=mismatch.calls, counts=mismatch.counts, group=group))
    return min(found, key=lambda m: min(e.t for e in m.present.values())) if found else None
