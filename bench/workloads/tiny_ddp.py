"""The tiny job of bench/existing_launch.py: join the process group, a few DDP steps on a small linear
model with gloo, leave. What it costs is mostly starting ranks, which is what the benchmark measures."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 5


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=generator)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()  # without it, a rank that tears gloo down while a peer still sends aborts now and then
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
