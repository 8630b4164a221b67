"""The data probe's account of a DataLoader's sampler: the sampler that draws under the batch
samplers wrapping it, and how many positions it covers. Pure reads of loader objects."""

from __future__ import annotations

import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler,
                              SubsetRandomSampler, TensorDataset)

from ddpdoctor.rank.probes.data import _batch_size, _sampler_info

DATA = TensorDataset(torch.arange(256))


class ShardBatches(BatchSampler):
    """Holds the loader's BatchSampler as ``batch_sampler``, as Accelerate's BatchSamplerShard does."""

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self.batch_sampler = batch_sampler
        self.batch_size = batch_sampler.batch_size

    def __iter__(self):
        yield from self.batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)


class EvenBatches(Sampler):
    """A batch sampler that draws by itself: no sampler inside."""

    def __iter__(self):
        yield from ([i, i + 1] for i in range(0, 256, 2))

    def __len__(self) -> int:
        return 128


def test_a_plain_shuffling_loader_names_its_random_sampler_and_covers_the_dataset():
    info = _sampler_info(DataLoader(DATA, batch_size=8, shuffle=True))
    assert (info.type, info.batch_sampler, info.shuffle, info.population) == ("RandomSampler", "BatchSampler", True,
                                                                              256)


def test_the_sampler_under_a_batch_sampler_that_wraps_another_is_named():
    inner = BatchSampler(RandomSampler(DATA), batch_size=96, drop_last=False)
    loader = DataLoader(DATA, batch_sampler=ShardBatches(inner))
    info = _sampler_info(loader)
    assert (info.type, info.batch_sampler, info.shuffle, info.population) == ("RandomSampler", "ShardBatches", True,
                                                                              256)
    assert _batch_size(loader) == 96


def test_a_batch_sampler_that_draws_by_itself_is_the_sampler_and_covers_an_unknown_population():
    info = _sampler_info(DataLoader(DATA, batch_sampler=EvenBatches()))
    assert (info.type, info.population) == ("EvenBatches", None)


def test_a_subset_random_sampler_covers_its_indices_and_a_distributed_wrapper_its_dataset():
    assert _sampler_info(DataLoader(DATA, sampler=SubsetRandomSampler(list(range(128))))).population == 128
    fold = SubsetRandomSampler(list(range(128)))
    wrapped = DistributedSampler(list(fold), num_replicas=2, rank=0)  # what DistributedSamplerWrapper shards
    info = _sampler_info(DataLoader(DATA, sampler=wrapped))
    assert (info.type, info.distributed, info.population, info.total_size) == ("DistributedSampler", True, 128, 128)


def test_random_draws_that_leave_samples_out_by_design_cover_an_unknown_population():
    assert _sampler_info(DataLoader(DATA, sampler=RandomSampler(DATA, replacement=True))).population is None
    assert _sampler_info(DataLoader(DATA, sampler=RandomSampler(DATA, num_samples=10))).population is None
    assert _sampler_info(DataLoader(DATA, sampler=SequentialSampler(DATA))).population == 256


def test_accelerate_batch_sampler_shard_names_the_loader_s_random_sampler():
    from accelerate.data_loader import BatchSamplerShard

    loader = DataLoader(DATA, batch_sampler=BatchSamplerShard(BatchSampler(RandomSampler(DATA), 96, False), 2, 1))
    info = _sampler_info(loader)
    assert (info.type, info.batch_sampler, info.population) == ("RandomSampler", "BatchSamplerShard", 256)
    assert _batch_size(loader) == 96


def test_lightning_distributed_sampler_wrapper_covers_the_wrapped_fold():
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    wrapped = DistributedSamplerWrapper(SubsetRandomSampler(list(range(128))), num_replicas=2, rank=1)
    info = _sampler_info(DataLoader(DATA, sampler=wrapped))
    assert (info.type, info.distributed, info.rank, info.population) == ("DistributedSamplerWrapper", True, 1, 128)
