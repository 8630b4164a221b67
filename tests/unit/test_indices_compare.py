"""Sample-index encoding round trip, and the cross-rank fingerprint comparison."""

from __future__ import annotations

import random

import pytest

from ddpdoctor.analysis.compare import RTOL, differs, relative_difference
from ddpdoctor.schema.indices import decode_indices, encode_indices, merge_encoded, order_hash


@pytest.mark.parametrize("indices", [
    [], [0], [5, 1, 3, 3, 0], [7, 7, 7], [2**40, 0, 2**40 + 1], [-3, 4, -3],
    list(range(10_000)), list(range(10_000))[::-1],
])
def test_encode_decode_round_trip_is_the_sorted_multiset(indices):
    encoded = encode_indices(indices)
    assert isinstance(encoded, str)
    encoded.encode("ascii")
    assert decode_indices(encoded) == sorted(indices)


def test_merged_parts_decode_to_the_union_multiset():
    parts = [[9, 2], [], [2, 5, 2**40], [-1]]
    merged = merge_encoded(encode_indices(p) for p in parts)
    assert decode_indices(merged) == sorted(i for p in parts for i in p)
    assert decode_indices(merge_encoded([])) == []


def test_gaps_use_the_narrowest_type():
    assert encode_indices(range(0, 1000, 3)).startswith("u1,0,")
    assert encode_indices([0, 70_000]).startswith("u4,0,")


def test_duplicates_are_kept():
    assert decode_indices(encode_indices([3, 1, 3, 2, 1])) == [1, 1, 2, 3, 3]


def test_random_shuffle_round_trip():
    rng = random.Random(0)
    indices = [rng.randrange(1000) for _ in range(5000)]
    assert decode_indices(encode_indices(indices)) == sorted(indices)


def test_encoding_ignores_order_and_order_hash_does_not():
    assert encode_indices([3, 1, 2]) == encode_indices([1, 2, 3])
    assert order_hash([1, 2, 3]) == order_hash([1, 2, 3])
    assert order_hash([3, 1, 2]) != order_hash([1, 2, 3])


# -- compare.differs ---------------------------------------------------------------------------------

def test_equal_fingerprints_do_not_differ():
    assert RTOL == 1e-6
    assert not differs([1.5, 2.0], [1.5, 2.0])
    assert not differs([0.0, 0.0], [0.0, 0.0])
    assert not differs(None, None)


def test_relative_difference_of_1e9_is_within_tolerance():
    assert not differs([1234.5678, 1e-3], [1234.5678 * (1 + 1e-9), 1e-3 * (1 - 1e-9)])
    assert not differs([-5.0, 5.0], [-5.0 * (1 + 1e-9), 5.0])


def test_differences_beyond_tolerance_differ():
    assert differs([1.0, 2.0], [1.0, 2.0 * (1 + 1e-5)])
    assert differs([1.0, 2.0], [-1.0, 2.0])
    assert differs([0.0, 0.0], [1e-9, 0.0])


def test_custom_tolerance():
    assert not differs([1.0], [1.01], rtol=0.1)
    assert differs([1.0], [1.01], rtol=1e-3)


def test_missing_tensor_against_present_one_differs():
    assert differs(None, [1.0, 1.0])
    assert differs([1.0, 1.0], None)


def test_relative_difference():
    assert relative_difference([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert relative_difference([1.0, 4.0], [1.0, 2.0]) == pytest.approx(0.5)
    assert relative_difference(None, [1.0]) == float("inf")


def test_nan_against_finite_differs():
    assert differs([float("nan"), float("nan")], [1.0, 1.0])


def test_inf_against_finite_differs():
    assert differs([float("inf"), float("inf")], [1.0, 1.0])
