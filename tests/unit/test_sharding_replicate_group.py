"""The sharding probe's replicate group: the global ranks that hold the recording rank's shard, read
from the device mesh's rank layout and the rank's coordinate in it (no collective)."""

from __future__ import annotations

import pytest
import torch

from ddpdoctor.rank.probes.sharding import _replicate_group


class _Mesh:
    """What the probe reads of a DeviceMesh: its rank layout and this rank's coordinate."""

    def __init__(self, layout: torch.Tensor, rank: int) -> None:
        self.mesh = layout
        self._rank = rank

    def get_coordinate(self):
        found = (self.mesh == self._rank).nonzero()
        return [int(i) for i in found[0]] if len(found) else None


@pytest.mark.parametrize("rank, peers", [(0, [0, 2]), (1, [1, 3]), (2, [0, 2]), (3, [1, 3])])
def test_hsdp_peers_share_the_shard_coordinate(rank, peers):
    assert _replicate_group(_Mesh(torch.arange(4).reshape(2, 2), rank)) == peers  # replicate x shard


def test_a_larger_replicate_dimension_and_a_permuted_layout():
    layout = torch.tensor([[4, 5], [0, 1], [2, 3]])
    assert _replicate_group(_Mesh(layout, 1)) == [5, 1, 3]


def test_a_1d_mesh_has_the_rank_alone_and_a_rank_outside_the_mesh_nothing():
    assert _replicate_group(_Mesh(torch.arange(2), 1)) == [1]
    assert _replicate_group(_Mesh(torch.arange(4).reshape(2, 2), 7)) == []
    assert _replicate_group(object()) == []
