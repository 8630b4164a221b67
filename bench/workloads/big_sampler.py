"""Benchmark workload: a DistributedSampler over a large dataset (default 10M samples), 2 epochs,
a tiny model. Each rank prints its peak RSS, so the probes' extra memory can be measured.

Batches come through `__getitems__` (one call per batch), so the loader costs what the sampler
costs, not millions of `__getitem__` calls.
"""

from __future__ import annotations

import argparse
import resource

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Synthetic(Dataset):
    """Sample i is (i mod 97) / 97 with target twice that: learnable, nothing stored."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        return self.__getitems__([i])

    def __getitems__(self, indices: list[int]):
        x = torch.tensor(indices, dtype=torch.int64).remainder_(97).float().div_(97).unsqueeze(1)
        return x, 2 * x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Synthetic(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, collate_fn=lambda batch: batch)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"PEAK_RSS_MIB rank {dist.get_rank()} {peak_mib:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
