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

PassId = tuple[int, str, int]  # (rank, loader key, raw pass number)
_Group = tuple[str, int]  # (role, sampler epoch or -1)
_Label = tuple[str, int, int]  # (role, sampler epoch or -1, ordinal among the rank's passes of that group)
_Paired = tuple[str, str, int, int]  # (loader key, *_Label)


def role(*, fed: bool, complete: bool) -> str:
    if fed:
        return "train"
    return "eval" if complete else "partial"


def pair(passes: Iterable[tuple[int, str, int, str, Optional[int]]]) -> dict[PassId, int]:
    """(rank, key, raw number) -> the pass's number as paired across ranks, from (rank, key, raw
    number, role, sampler epoch or None) of every pass. A loader's paired passes are numbered in the
    order the ranks made them (the earliest raw number among the ranks that made each)."""
    by_rank: dict[tuple[int, str], list[tuple[int, _Group]]] = {}
    for rank, key, number, kind, epoch in passes:
        by_rank.setdefault((rank, key), []).append((number, (kind, -1 if epoch is None else epoch)))
    labels: dict[PassId, _Label] = {}
    first_seen: dict[_Paired, int] = {}  # (key, role, epoch, ordinal) -> earliest raw number
    for (rank, key), numbered in by_rank.items():
        ordinals: dict[_Group, int] = {}
        for number, group in sorted(numbered):
            ordinal = ordinals.get(group, 0)
            ordinals[group] = ordinal + 1
            group_role, group_epoch = group
            labels[(rank, key, number)] = (group_role, group_epoch, ordinal)
            seen = (key, group_role, group_epoch, ordinal)
            first_seen[seen] = min(first_seen.get(seen, number), number)
    order: dict[str, list[tuple[int, str, int, int]]] = {}
    for (key, group_role, group_epoch, ordinal), number in first_seen.items():
        order.setdefault(key, []).append((number, group_role, group_epoch, ordinal))
    paired: dict[_Paired, int] = {}
    for key, items in order.items():
        for index, (_, group_role, group_epoch, ordinal) in enumerate(sorted(items)):
            paired[(key, group_role, group_epoch, ordinal)] = index
    return {pass_id: paired[(pass_id[1],) + label] for pass_id, label in labels.items()}
