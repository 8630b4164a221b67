"""SyncBatchNorm on CPU, with its cross-rank semantics kept.

torch's SyncBatchNorm refuses CPU input, and the kernels its autograd function uses
(``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``) have no CPU
implementation in torch 2.13. Under simulation a CPU input takes :func:`sync_batch_norm` instead:
the same math (statistics over the union of every rank's batch, running statistics updated with
the unbiased global variance) from per-channel sums all-reduced through a differentiable
all_reduce, so the backward pass reduces the statistics' gradients across ranks as torch's does.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder

PROBE = "device"
SIMULATED = "SyncBatchNorm(cuda)->cpu all_reduce"

Reduce = Callable[[Tensor], Tensor]  # differentiable sum of a tensor over the ranks


def sync_batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], running_mean: Optional[Tensor],
                    running_var: Optional[Tensor], *, momentum: float, eps: float, reduce: Reduce) -> Tensor:
    """Batch norm in training mode over the batches of every rank (``reduce`` sums across ranks)."""
    channels = input.shape[1]
    dims = [d for d in range(input.dim()) if d != 1]
    local_count = input.numel() // channels if channels else 0
    stats = torch.cat([input.sum(dims, dtype=torch.float64), (input * input).sum(dims, dtype=torch.float64),
                       torch.full((1,), float(local_count), dtype=torch.float64)])
    total = reduce(stats)
    count = total[-1]
    mean = total[:channels] / count
    var = (total[channels:2 * channels] / count - mean * mean).clamp_min(0.0)
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            n = float(count)
            unbiased = var * (n / (n - 1)) if n > 1 else var
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    shape = [1, channels] + [1] * (input.dim() - 2)
    invstd = torch.rsqrt(var + eps)
    out = (input - mean.to(input.dtype).view(shape)) * invstd.to(input.dtype).view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out


def all_reduce_sum(group) -> Reduce:
    from torch.distributed.nn.functional import all_reduce

    return lambda tensor: all_reduce(tensor, group=group)


def install(rec: Recorder, ledger: Ledger) -> None:
    def wrap_forward(original):
        def forward(self, input: Tensor) -> Tensor:
            if input.device.type != "cpu" or not self.training or not (dist.is_available() and dist.is_initialized()):
                return original(self, input)
            group = self.process_group or dist.group.WORLD
            if dist.get_world_size(group) < 2:
                return original(self, input)
            self._check_input_dim(input)
            self._check_non_zero_input_channels(input)
            momentum = 0.0 if self.momentum is None else self.momentum
            if self.track_running_stats:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:
                    momentum = 1.0 / self.num_batches_tracked.item()
            ledger.count(SIMULATED)
            return sync_batch_norm(input, self.weight, self.bias,
                                   self.running_mean if self.track_running_stats else None,
                                   self.running_var if self.track_running_stats else None,
                                   momentum=momentum, eps=self.eps, reduce=all_reduce_sum(group))

        return forward

    patch(rec, PROBE, torch.nn.SyncBatchNorm, "forward", wrap_forward)

    def wrap_ddp_check(original):
        def _passing_sync_batchnorm_handle(self, module):
            if self.device_type == "cpu":
                return None  # DDP refuses SyncBatchNorm on CPU modules; the forward above handles them
            return original(self, module)

        return _passing_sync_batchnorm_handle

    patch(rec, PROBE, DistributedDataParallel, "_passing_sync_batchnorm_handle", wrap_ddp_check)
