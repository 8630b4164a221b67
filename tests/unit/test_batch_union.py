"""The global batch from the ranks' batches: joined along the batch dimension where only that differs,
collated from the union of indices where each rank's batch was padded on its own, refused where
neither gives the exact global batch; input rows compared across paddings."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from ddpdoctor.rank.batch_union import collate_union, copy_batch, join, row_prefixes, same, same_rows


def test_tensors_tuples_and_dicts_join_along_the_batch_dimension():
    a = (torch.zeros(2, 3), {"ids": torch.tensor([1, 2]), "text": ["x", "y"]})
    b = (torch.ones(1, 3), {"ids": torch.tensor([3]), "text": ["z"]})
    joined = join([a, b])
    assert joined[0].shape == (3, 3) and joined[1]["ids"].tolist() == [1, 2, 3] and joined[1]["text"] == ["x", "y", "z"]


def test_a_namedtuple_stays_one():
    Batch = namedtuple("Batch", "x y")
    joined = join([Batch(torch.zeros(1), torch.zeros(1)), Batch(torch.ones(2), torch.ones(2))])
    assert isinstance(joined, Batch) and joined.x.tolist() == [0.0, 1.0, 1.0]


def test_batches_padded_per_rank_cannot_be_joined():
    with pytest.raises(ValueError, match="differ beyond the batch dimension"):
        join([torch.zeros(2, 5), torch.zeros(2, 7)])
    with pytest.raises(ValueError, match="different scalars"):
        join([torch.tensor(3), torch.tensor(4)])


def _pad(items: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(len(items), max(len(i) for i in items), dtype=torch.long)
    for row, item in enumerate(items):
        out[row, :len(item)] = item
    return out


def test_the_union_is_collated_by_the_loaders_own_function_after_each_rank_comes_back():
    data = [torch.arange(1, n + 1) for n in (2, 5, 3, 4)]
    recorded = [_pad([data[0], data[2]]), _pad([data[1], data[3]])]
    union = collate_union(data, _pad, [[0, 2], [1, 3]], recorded)
    assert union.shape == (4, 5) and union[1].tolist() == [1, 2, 3, 0, 0]


def test_items_that_change_between_reads_are_refused_and_the_generator_is_untouched():
    class Augmented:
        def __getitem__(self, i):
            return torch.rand(2) + i
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match="random augmentation"):
        collate_union(Augmented(), torch.stack, [[0], [1]], [torch.zeros(1, 2), torch.zeros(1, 2)])
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_copy_does_not_follow_in_place_changes():
    batch = {"x": torch.zeros(2)}
    copied = copy_batch(batch)
    batch["x"].add_(1)
    assert copied["x"].tolist() == [0.0, 0.0] and same(copied, {"x": torch.zeros(2)})


def test_rows_padded_to_different_widths_compare_alike_and_other_rows_do_not():
    rank0 = _pad([torch.tensor([5, 3]), torch.tensor([4, 4, 4, 9])])  # width 4
    rank1 = _pad([torch.tensor([7])])
    union = _pad([torch.tensor([7]), torch.tensor([5, 3]), torch.tensor([4, 4, 4, 9]), torch.tensor([1] * 6)])[:3]
    assert same_rows([row_prefixes(rank0), row_prefixes(rank1)], [row_prefixes(union)])
    other = union.clone()
    other[0, 0] = 8
    assert not same_rows([row_prefixes(rank0), row_prefixes(rank1)], [row_prefixes(other)])
    assert not same_rows([row_prefixes(rank0)], [])
