"""Overlap of the sample-index sets that ranks drew in one pass, on int64 arrays.

Passes hold millions of indices per rank; Python sets and Counters of that size take seconds and
gigabytes. Indices are positions in a dataset, so they are dense: counting them in a table as long
as the range they span is linear time, and sorting is left for sparse sets (many ranks, each with
a small share of a large range).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ddpdoctor.schema.indices import decode_unsorted

__all__ = ["Overlap", "distinct_indices", "overlap", "repeat_count"]

# A table this many times longer than the indices it counts (plus a fixed allowance) is still
# cheaper than sorting them.
_DENSE_FACTOR = 8
_DENSE_ALLOWANCE = 1 << 16
# Share of the drawn samples that must have been drawn the same number of times, for that number to
# be a repetition by design (the last few of an epoch's repeated list may be cut short).
REPEAT_SHARE = 0.9


@dataclass(frozen=True)
class Overlap:
    sizes: dict[int, int]  # distinct samples each rank drew
    union: int  # distinct samples drawn by any rank
    shared: np.ndarray  # sorted samples drawn by more than one rank

    @property
    def drawn(self) -> int:
        return sum(self.sizes.values())


def _dense(values: np.ndarray) -> tuple[bool, int, int]:
    if not values.size:
        return False, 0, 0
    low, high = int(values.min()), int(values.max())
    return high - low < _DENSE_FACTOR * values.size + _DENSE_ALLOWANCE, low, high


def distinct_indices(encoded: str) -> np.ndarray:
    """The distinct samples of one encoded pass, sorted."""
    values = decode_unsorted(encoded)
    dense, low, high = _dense(values)
    if not dense:
        return np.unique(values)
    seen = np.zeros(high - low + 1, dtype=bool)
    seen[values - low] = True
    return np.flatnonzero(seen) + low


def overlap(per_rank: dict[int, np.ndarray]) -> Overlap:
    """Which samples more than one rank drew, given each rank's distinct samples."""
    sizes = {rank: int(a.size) for rank, a in per_rank.items()}
    values = np.concatenate(list(per_rank.values())) if per_rank else np.empty(0, dtype=np.int64)
    dense, low, _ = _dense(values)
    if dense:
        counts = np.bincount(values - low)
        return Overlap(sizes=sizes, union=int(np.count_nonzero(counts)), shared=np.flatnonzero(counts > 1) + low)
    unique, counts = np.unique(values, return_counts=True)
    return Overlap(sizes=sizes, union=int(unique.size), shared=unique[counts > 1])


def repeat_count(encoded: dict[int, str]) -> Optional[int]:
    """The number k >= 2 of times nearly every drawn sample was drawn in all, given each rank's
    encoded draws (duplicates kept), when every rank drew a different multiset: each sample repeated
    on k draws by design (repeated augmentation). None when the counts vary (random overlap) or two
    ranks drew the same samples alike."""
    draws = [np.sort(decode_unsorted(e)) for e in encoded.values()]
    if len({hashlib.blake2b(d.astype("<i8").tobytes(), digest_size=16).digest() for d in draws}) < len(draws):
        return None
    values = np.concatenate(draws) if draws else np.empty(0, dtype=np.int64)
    if not values.size:
        return None
    counts = np.unique(values, return_counts=True)[1]
    k = int(np.bincount(counts).argmax())
    if k < 2 or np.count_nonzero(counts == k) < REPEAT_SHARE * counts.size:
        return None
    return k
