"""The dataset identity digest: equal for datasets built alike, different for datasets each rank
builds for itself, read from the dataset's state without ever reading an item."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, TensorDataset

from ddpdoctor.rank.dataset_identity import dataset_digest


class Files(Dataset):
    """A dataset over a list of paths, as image loaders hold them; reading an item is an error here."""

    def __init__(self, paths: list[str]) -> None:
        self.local_images = paths
        self.transform = None

    def __len__(self) -> int:
        return len(self.local_images)

    def __getitem__(self, index: int):
        raise AssertionError("the digest must never read an item")


PATHS = [f"/data/train/{i:07d}.png" for i in range(1000)]


def test_datasets_built_alike_have_one_digest():
    assert dataset_digest(Files(list(PATHS))) == dataset_digest(Files(list(PATHS)))
    data = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert dataset_digest(TensorDataset(data, torch.arange(64))) == \
        dataset_digest(TensorDataset(data.clone(), torch.arange(64)))


def test_a_shard_per_rank_differs_even_at_equal_length():
    assert dataset_digest(Files(PATHS[0::2])) != dataset_digest(Files(PATHS[1::2]))


def test_data_generated_from_the_rank_differs():
    made = [TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(rank))) for rank in range(2)]
    assert dataset_digest(made[0]) != dataset_digest(made[1])


def test_nested_datasets_and_object_arrays_are_read_too():
    assert dataset_digest(ConcatDataset([Files(PATHS[:10])])) != dataset_digest(ConcatDataset([Files(PATHS[10:20])]))

    class Table(Dataset):
        def __init__(self, names: np.ndarray) -> None:
            self.names = names

    assert dataset_digest(Table(np.array(PATHS[:4], dtype=object))) != \
        dataset_digest(Table(np.array(PATHS[4:8], dtype=object)))


def test_containers_that_could_load_on_access_are_left_alone():
    class Lazy(dict):
        def items(self):
            raise AssertionError("read")

    class Store:
        def __getitem__(self, key):
            raise AssertionError("read")

    class Holder(Dataset):
        def __init__(self) -> None:
            self.store = Store()
            self.module = torch

    assert dataset_digest(Holder()) is not None
    assert dataset_digest(Lazy(a=1)) is None  # a dict subclass that fails: no identity, never an error


def test_a_million_paths_are_read_a_few_at_a_time():
    class Counted(list):
        reads = 0

        def __getitem__(self, index):
            Counted.reads += 1
            return super().__getitem__(index)

    dataset_digest(Files(Counted(f"/data/{i}.png" for i in range(1_000_000))))
    assert 0 < Counted.reads <= 24
