"""Two gloo ranks sharing one GPU (NCCL refuses that, gloo does not): DDP on cuda:0 for both, so the
fingerprints of a GPU's parameters and gradients reach the host behind CUDA events and are still
compared across ranks. ``--bug scale-grad``: rank 1 doubles its gradients after DDP averaged them
(a gradient-sync error); without it, a known-good twin.

    ddpdoctor check bench/gpu_fixtures/shared_gpu_sync.py -n 2 --device native [-- --bug scale-grad]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--bug", choices=["none", "scale-grad"], default="none")
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(0)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                    torch.nn.Linear(64, 4)).cuda())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
generator = torch.Generator(device="cuda").manual_seed(rank)
for step in range(args.steps):
    inputs = torch.randn(64, 32, device="cuda", generator=generator)
    target = torch.randint(0, 4, (64,), device="cuda", generator=generator)
    loss = F.cross_entropy(model(inputs), target)
    optimizer.zero_grad()
    loss.backward()
    if args.bug == "scale-grad" and rank == 1:
        for p in model.parameters():
            p.grad.mul_(2)
    optimizer.step()
print(f"rank {rank}: final loss {loss.item():.4f}")
dist.destroy_process_group()
