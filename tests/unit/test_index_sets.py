"""Overlap of index sets: the dense (counting table) and sparse (sorting) paths agree with sets."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ddpdoctor.analysis.index_sets import distinct_indices, overlap
from ddpdoctor.schema.indices import encode_indices, merge_encoded


def _expected(per_rank: dict[int, list[int]]) -> tuple[int, list[int]]:
    sets = {r: set(v) for r, v in per_rank.items()}
    union = set().union(*sets.values())
    shared = sorted(i for i in union if sum(i in s for s in sets.values()) > 1)
    return len(union), shared


@pytest.mark.parametrize("spread", [10, 10**12], ids=["dense", "sparse"])
def test_overlap_matches_sets(spread):
    rng = random.Random(spread)
    per_rank = {r: [rng.randrange(spread) * 3 - 7 for _ in range(500)] for r in range(4)}
    distinct = {r: distinct_indices(merge_encoded([encode_indices(v[:200]), encode_indices(v[200:])]))
                for r, v in per_rank.items()}
    for r, values in per_rank.items():
        assert distinct[r].tolist() == sorted(set(values))
    found = overlap(distinct)
    union, shared = _expected(per_rank)
    assert found.union == union
    assert found.shared.tolist() == shared
    assert found.sizes == {r: len(set(v)) for r, v in per_rank.items()}


def test_duplicates_within_one_rank_are_not_shared():
    found = overlap({0: distinct_indices(encode_indices([1, 1, 2])), 1: distinct_indices(encode_indices([3, 4]))})
    assert found.shared.size == 0 and found.union == 4 and found.drawn == 4


def test_empty_passes():
    found = overlap({0: distinct_indices(encode_indices([])), 1: np.empty(0, dtype=np.int64)})
    assert found.union == 0 and found.shared.size == 0
