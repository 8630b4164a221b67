"""Tensor fingerprints: [sum, L2 norm] per tensor, compared across ranks.

Computed in the tensor's own precision (float32 for float16/bfloat16) with vectorized kernels:
identical replicas give bit-identical values, a missed all-reduce changes them by orders of
magnitude more than any tolerance. Upcasting to float64 first cost ~25x more on CPU for nothing.
One device-to-host copy per call for all tensors together.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

Fingerprint = Optional[list]  # [sum, norm] or None for a missing tensor (e.g. grad is None)

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@torch.no_grad()
def fingerprint(tensors: Sequence[Optional[torch.Tensor]]) -> list[Fingerprint]:
    """[sum, L2 norm] for each tensor, None where the tensor is None."""
    present = [i for i, t in enumerate(tensors) if t is not None]
    out: list[Fingerprint] = [None] * len(tensors)
    if not present:
        return out
    parts = []
    for i in present:
        t = tensors[i].detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.is_floating_point():
            accumulate = torch.float32 if t.dtype in _LOW_PRECISION else None
            parts.append(t.sum(dtype=accumulate))
            parts.append(torch.linalg.vector_norm(t, dtype=accumulate))
        else:  # integer buffers such as num_batches_tracked
            parts.append(t.sum().to(torch.float64))
            parts.append(t.abs().sum().to(torch.float64))
    try:
        values = torch.stack([p.to(torch.float64) for p in parts]).tolist()
    except RuntimeError:  # tensors on several devices
        values = torch.stack([p.to("cpu", torch.float64) for p in parts]).tolist()
    for k, i in enumerate(present):
        out[i] = [values[2 * k], values[2 * k + 1]]
    return out
