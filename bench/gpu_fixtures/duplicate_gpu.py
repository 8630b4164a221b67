"""Two NCCL ranks on one GPU (both call set_device(0)): NCCL refuses with "Duplicate GPU detected".
Used on a GPU machine to capture the real error text ddpdoctor decodes."""

import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
print(t.sum().item())
dist.destroy_process_group()
