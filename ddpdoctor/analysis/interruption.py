"""What a stop signal cut off, left out before the checks judge an interrupted run.

A signal ends every rank wherever it is: one rank halfway through a pass over its loader and its
peer a batch further, one optimizer step more here than there, a collective made on one rank only.
That is the moment of the stop, not the job's behaviour, and no check may draw a finding from it
("rank 0: 852 batches, rank 1: 851"). For every rank alike this leaves out:

- each loader's passes (and content passes) from the first one that some rank had not finished
  when the signal came, or had not reached;
- each optimizer's steps beyond the last step that every rank completed;
- world collectives beyond the number that every rank made.

Everything the ranks completed before the signal is judged as usual, so a real problem found
before it (a crash, replicas that diverged, overlapping shards in a finished epoch) is still
reported. Pure: evidence in, evidence trimmed in place, a summary of what was left out back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts import derived
from ddpdoctor.schema.events import Collective, ContentPass, Event, LoaderPass, Step

__all__ = ["LeftOut", "leave_out_cut_off", "summary"]

_POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv"})


@dataclass
class LeftOut:
    """What the stop cut off, per kind: passes ("loader#number"), steps and collectives per rank."""

    passes: list[str] = field(default_factory=list)
    steps: dict[int, int] = field(default_factory=dict)
    collectives: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"passes": self.passes, "steps": {str(r): n for r, n in sorted(self.steps.items())},
                "collectives": {str(r): n for r, n in sorted(self.collectives.items())}}


def _pass_key(event: Event) -> Optional[str]:
    """Passes that share a key are cut together: a loader's LoaderPass and its ContentPass."""
    if isinstance(event, LoaderPass):
        return event.loader
    if isinstance(event, ContentPass):
        return event.key if event.source == "loader" else f"{event.source}:{event.key}"
    return None


def _pass_cuts(evidence: Evidence) -> dict[str, int]:
    """Pass key -> the first pass number not finished on every rank that used the key."""
    last_part: dict[tuple[str, int, int], Event] = {}  # (key, number, rank) -> its last part
    for rank, ev in evidence.ranks.items():
        for event in ev.events:
            key = _pass_key(event)
            if key is None:
                continue
            slot = (key, event.number, rank)  # type: ignore[attr-defined]
            current = last_part.get(slot)
            if current is None or event.part >= current.part:  # type: ignore[attr-defined]
                last_part[slot] = event
    first_unfinished: dict[str, dict[int, int]] = {}
    last_number: dict[str, dict[int, int]] = {}
    for (key, number, rank), part in last_part.items():
        last = last_number.setdefault(key, {})
        last[rank] = max(last.get(rank, number), number)
        if not part.final:  # type: ignore[attr-defined]
            unfinished = first_unfinished.setdefault(key, {})
            unfinished[rank] = min(unfinished.get(rank, number), number)
    return {key: min(first_unfinished.get(key, {}).get(rank, last + 1) for rank, last in ranks.items())
            for key, ranks in last_number.items()}


def _common_steps(evidence: Evidence) -> dict[int, int]:
    """Optimizer -> the last step number every rank that stepped it completed."""
    last: dict[int, dict[int, int]] = {}
    for rank, event in evidence.events(Step):
        per_rank = last.setdefault(event.opt, {})
        per_rank[rank] = max(per_rank.get(rank, 0), event.n)
    return {opt: min(per_rank.values()) for opt, per_rank in last.items()}


def _is_world_collective(event: Event) -> bool:
    return isinstance(event, Collective) and event.group is None and event.op not in _POINT_TO_POINT


def leave_out_cut_off(evidence: Evidence) -> LeftOut:
    """Trim ``evidence`` (of an interrupted run) to what every rank completed; say what went."""
    left = LeftOut()
    cuts = _pass_cuts(evidence)
    steps = _common_steps(evidence)
    counts = [sum(1 for e in ev.events if _is_world_collective(e)) for ev in evidence.ranks.values()]
    common_collectives = min((c for c in counts if c), default=0)
    dropped_passes: set[str] = set()
    for rank, ev in evidence.ranks.items():
        kept: list[Event] = []
        num_collectives = 0
        for event in ev.events:
            key = _pass_key(event)
            if key is not None and event.number >= cuts[key]:  # type: ignore[attr-defined]
                dropped_passes.add(f"{key}#{event.number}")  # type: ignore[attr-defined]
                continue
            if isinstance(event, Step) and event.n > steps.get(event.opt, event.n):
                left.steps[rank] = left.steps.get(rank, 0) + 1
                continue
            if _is_world_collective(event):
                num_collectives += 1
                if num_collectives > common_collectives:
                    left.collectives[rank] = left.collectives.get(rank, 0) + 1
                    continue
            kept.append(event)
        if len(kept) != len(ev.events):
            ev.events = kept
            ev._by_kind = None  # the per-kind index is rebuilt from the kept events
    left.passes = sorted(dropped_passes)
    derived.forget(evidence)  # no fact derived before the trim (of the cut-off counts) outlives it
    return left


def summary(left: LeftOut) -> str:
    """One line for the report: what the checks did not judge."""
    parts = []
    loaders = [p for p in left.passes if not p.startswith("forward:")]
    if loaders:
        parts.append(f"{len(loaders)} unfinished loader pass{'es' if len(loaders) != 1 else ''}")
    if left.steps:
        parts.append(f"{sum(left.steps.values())} optimizer step(s) not every rank completed")
    if left.collectives:
        parts.append(f"{sum(left.collectives.values())} collective(s) not every rank made")
    return ", ".join(parts)
