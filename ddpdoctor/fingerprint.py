"""Tensor fingerprints: a couple of float64 numbers per tensor, compared across ranks.

Identical replicas give bit-identical fingerprints; a missed all-reduce changes them by orders of
magnitude more than any tolerance. One pass over memory the optimizer touches anyway, and one
device-to-host copy per call for all tensors together.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

Fingerprint = Optional[list]  # [sum, norm] or None for a missing tensor (e.g. grad is None)


@torch.no_grad()
def fingerprint(tensors: Sequence[Optional[torch.Tensor]]) -> list[Fingerprint]:
    """[sum, L2 norm] in float64 for each tensor, None where the tensor is None."""
    present = [i for i, t in enumerate(tensors) if t is not None]
    out: list[Fingerprint] = [None] * len(tensors)
    if not present:
        return out
    parts = []
    for i in present:
        t = tensors[i].detach()
        if t.is_floating_point() or t.is_complex():
            parts.append(t.sum(dtype=torch.float64).real if t.is_complex() else t.sum(dtype=torch.float64))
            parts.append(torch.linalg.vector_norm(t, dtype=torch.float64))
        else:
            parts.append(t.sum(dtype=torch.float64))
            parts.append(t.to(torch.float64).abs().sum())
    try:
        values = torch.stack(parts).tolist()
    except RuntimeError:  # tensors on several devices
        values = torch.stack([p.cpu() for p in parts]).tolist()
    for k, i in enumerate(present):
        out[i] = [values[2 * k], values[2 * k + 1]]
    return out
