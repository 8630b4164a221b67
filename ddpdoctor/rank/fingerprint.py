"""Tensor fingerprints, compared across ranks: [L2 norm, max] per tensor.

Computed with fused multi-tensor kernels (``torch._foreach_norm``, ``torch._foreach_max``): a
constant number of kernel launches per dtype and device, whatever the number of tensors, on the
tensors' own device, and one device-to-host copy for everything a step fingerprints (gradients and
parameters together, see :class:`Pending`). Identical replicas give bit-identical values; a missed
all-reduce changes the norm, a sign flip (which keeps the norm) the max, which as one of the
tensor's own values needs no accumulation. Norms accumulate in float32 (float64 tensors in float64).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

import torch

Fingerprint = Optional[list]  # [norm, max] or None for a missing tensor (e.g. grad is None)

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class Pending:
    """Fingerprints still on the device: resolved by one host copy, possibly with others."""

    def __init__(self, size: int, parts: list[tuple[list[int], torch.Tensor]], fixed: dict[int, list]) -> None:
        self.size = size
        self.parts = parts  # (positions, 1-d tensor on a device: the k norms, then the k maxes)
        self.fixed = fixed  # position -> value known on the host already (None, empty or meta tensors)

    def values(self) -> list[Fingerprint]:
        return resolve(self)[0]


@torch.no_grad()
def start(tensors: Sequence[Optional[torch.Tensor]], *, norms_only: bool = False) -> Pending:
    """Launch the fingerprint kernels of ``tensors`` without waiting for them.

    Per-tensor Python work is kept to attribute reads: on a 150-tensor model it is what costs most.
    ``norms_only``: one read per tensor instead of two; each value is then [norm, norm].
    """
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor]]] = defaultdict(list)
    integers: list[tuple[int, torch.Tensor]] = []
    fixed: dict[int, list] = {}
    for i, t in enumerate(tensors):
        if t is None:
            fixed[i] = None
            continue
        dtype = t.dtype
        if dtype.is_complex:
            t = torch.view_as_real(t)
            dtype = t.dtype
        if t.numel() == 0 or t.is_meta:
            fixed[i] = [0.0, 0.0]
        elif dtype.is_floating_point:
            groups[(t.device, dtype)].append((i, t))
        else:
            integers.append((i, t))
    parts = []
    for i, t in integers:  # integer buffers such as num_batches_tracked: few and tiny, still no sync here
        wide = t.double()
        norm = wide.norm()
        parts.append(([i], torch.stack([norm, norm if norms_only else wide.max()])))
    for (_, dtype), members in groups.items():  # per dtype: the fused kernels take one dtype at a time
        tensors_ = [t for _, t in members]
        # Accumulate float16/bfloat16 in float32, the others in their own precision: an explicit
        # dtype for float32 takes a slower path on CUDA, and float64 is twenty times slower on the CPU.
        norms = torch._foreach_norm(tensors_, 2, dtype=torch.float32 if dtype in _LOW_PRECISION else None)
        maxes = norms if norms_only else torch._foreach_max(tensors_)
        parts.append(([i for i, _ in members], torch.stack([*norms, *maxes])))
    return Pending(len(tensors), parts, fixed)


def resolve(*pending: Pending) -> list[list[Fingerprint]]:
    """The values of several pending fingerprints, with one host copy per device involved."""
    by_device: dict[torch.device, list[tuple[int, list[int], torch.Tensor]]] = defaultdict(list)
    for k, p in enumerate(pending):
        for positions, values in p.parts:
            by_device[values.device].append((k, positions, values))
    out: list[list[Fingerprint]] = []
    for p in pending:
        row: list[Fingerprint] = [None] * p.size
        for i, value in p.fixed.items():
            row[i] = value
        out.append(row)
    for items in by_device.values():
        tensors = [values for _, _, values in items]
        host = (tensors[0] if len(tensors) == 1 else torch.cat(tensors)).tolist()  # the one copy (and sync)
        offset = 0
        for k, positions, _ in items:
            count = len(positions)
            for j, position in enumerate(positions):
                out[k][position] = [host[offset + j], host[offset + count + j]]
            offset += 2 * count
    return out


def fingerprint(tensors: Sequence[Optional[torch.Tensor]]) -> list[Fingerprint]:
    """[norm, max] for each tensor, None where the tensor is None (launch and resolve at once)."""
    return start(tensors).values()
