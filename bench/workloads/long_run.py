"""Benchmark workload: a long run of tiny steps (default 100,000 optimizer steps), for the volume
of evidence the probes write per rank. A DataLoader with a DistributedSampler, set_epoch every
epoch, a metric all_reduce every 100 steps: what a long real job records, at a tiny step cost.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps-per-epoch", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    world = dist.get_world_size()
    size = args.steps_per_epoch * args.batch_size * world
    x = torch.randn(size, 16)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                metric = loss.detach().clone()
                dist.all_reduce(metric)
            if step >= args.steps:
                break
        epoch += 1
    if dist.get_rank() == 0:
        print(f"STEPS {step} EPOCHS {epoch}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
