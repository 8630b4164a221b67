"""Loader passes paired across ranks.

Each rank numbers its passes over a loader in the order it made them, and ranks need not make
the same ones: rank 0 alone may take a batch with `next(iter(loader))` to log it, a framework may
look ahead on one rank. Raw numbers then pair rank 0's training pass with rank 1's peek. Passes are
paired instead by their order among the passes of the same role and sampler epoch on each rank:
training passes (their batches fed training), complete passes that fed none (evaluation), and
partial ones (a peek, a loop left early). A peek only rank 0 made in epoch 0 then pairs with
nothing, not with the other ranks' peek of epoch 1. Pure: the roles come from the passes' own
counters.
"""

from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["role", "pair"]

PassId = tuple  # (rank, loader key, raw pass number)


def role(*, fed: bool, complete: bool) -> str:
    if fed:
        return "train"
    return "eval" if complete else "partial"


def pair(passes: Iterable[tuple[int, str, int, str, Optional[int]]]) -> dict[PassId, int]:
    """(rank, key, raw number) -> the pass's number as paired across ranks, from (rank, key, raw
    number, role, sampler epoch or None) of every pass. A loader's paired passes are numbered in the
    order the ranks made them (the earliest raw number among the ranks that made each)."""
    by_rank: dict[tuple[int, str], list[tuple[int, tuple]]] = {}
    for rank, key, number, kind, epoch in passes:
        by_rank.setdefault((rank, key), []).append((number, (kind, -1 if epoch is None else epoch)))
    labels: dict[PassId, tuple] = {}
    first_seen: dict[tuple, int] = {}  # (key, role, epoch, ordinal) -> earliest raw number
    for (rank, key), numbered in by_rank.items():
        ordinals: dict[tuple, int] = {}
        for number, group in sorted(numbered):
            ordinal = ordinals.get(group, 0)
            ordinals[group] = ordinal + 1
            label = (*group, ordinal)
            labels[(rank, key, number)] = label
            first_seen[(key, *label)] = min(first_seen.get((key, *label), number), number)
    order: dict[str, list[tuple]] = {}
    for (key, *label), number in first_seen.items():
        order.setdefault(key, []).append((number, *label))
    paired: dict[tuple, int] = {}
    for key, items in order.items():
        for index, (_, *label) in enumerate(sorted(items)):
            paired[(key, *label)] = index
    return {pass_id: paired[(pass_id[1], *label)] for pass_id, label in labels.items()}
