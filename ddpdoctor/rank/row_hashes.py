"""Sample fingerprints: one 63-bit hash per row of a batch, equal wherever the row's bits are equal.

Why not a float projection of the values: a float GEMM's rounding depends on how the library
blocks it (batch size, device, kernel), so the same sample in two batches could fingerprint
differently. Here each element's bit pattern, read as an integer (8-byte elements folded to 32
bits), is projected with a fixed matrix of integers below 2**10, in float64: every partial sum is
an integer below 2**52, so the result is exact whatever the summation order, batch size or device.
Four projections are mixed into one hash on the host, with one device-to-host copy per batch.

Sampling, so the cost stays flat on large batches: at most ``MAX_ROWS`` rows (a fixed stride over
the batch dimension) and ``MAX_FEATURES`` elements per row (a fixed stride over the flattened row).
Two different rows that agree on every sampled element get the same hash.

The projection comes from a private ``torch.Generator`` with a fixed seed: identical on every rank
and never touching the script's RNG. Nothing is written in place; no autograd graph is built.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["MAX_ROWS", "MAX_FEATURES", "fingerprintable", "row_hashes", "start", "finish", "mix"]

MAX_ROWS = 256
MAX_FEATURES = 1024  # elements below 2**32 in magnitude, weights below 2**10: sums stay below 2**52
NUM_PROJECTIONS = 4
_SEED = 0x5EED_D0C7
_MASK63 = (1 << 63) - 1
_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_projections: dict[torch.device, torch.Tensor] = {}
_scratch: dict[tuple, torch.Tensor] = {}  # row-block shape -> a CPU float64 buffer (see start)


def _projection(device: torch.device) -> torch.Tensor:
    """The fixed projection, MAX_FEATURES x NUM_PROJECTIONS float64 on ``device``, as the transpose
    of a contiguous matrix: MKL's float64 GEMM of a batch's rows by a transposed operand took 47 us
    against 98 for 64 rows of 1024 (the sums are exact integers either way)."""
    matrix = _projections.get(device)
    if matrix is None:
        generator = torch.Generator().manual_seed(_SEED)
        weights = torch.randint(1, 1 << 10, (MAX_FEATURES, NUM_PROJECTIONS), generator=generator)
        matrix = _projections[device] = weights.t().contiguous().to(torch.float64).to(device).t()
    return matrix


def fingerprintable(tensor: object) -> bool:
    """A dense tensor with a batch dimension, not a model output (those carry autograd history)."""
    return (isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 and tensor.shape[0] > 0 and tensor.numel() > 0
            and tensor.layout == torch.strided and not tensor.is_complex() and not tensor.is_meta
            and not tensor.requires_grad)


@torch.no_grad()
def start(batch: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Launch the projection of ``batch``'s sampled rows on its own device: (sums, row width)."""
    rows = batch.detach()
    if rows.shape[0] > MAX_ROWS:
        rows = rows[:: -(-rows.shape[0] // MAX_ROWS)]
    flat = rows.reshape(rows.shape[0], -1)
    width = flat.shape[1]
    if width > MAX_FEATURES:
        flat = flat[:, :: -(-width // MAX_FEATURES)]
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    bits = flat.view(_INT_VIEW[flat.element_size()])
    if bits.element_size() == 8:
        bits = (bits ^ (bits >> 32)) & 0xFFFFFFFF
    projection = _projection(batch.device)[: bits.shape[1]]
    if bits.device.type != "cpu":
        return bits.to(torch.float64) @ projection, width
    # On a CPU, the float64 copy goes into a buffer kept between batches: a fresh one of this size
    # (512 KiB for 64 rows of 1024) is mapped anew by the allocator, and its page faults cost three
    # times the projection. (Not on a GPU: there a kept buffer could race with another stream.)
    scratch = _scratch.get(tuple(bits.shape))
    if scratch is None:
        if len(_scratch) >= 4:
            _scratch.clear()
        scratch = _scratch[tuple(bits.shape)] = torch.empty(bits.shape, dtype=torch.float64)
    return torch.mm(scratch.copy_(bits), projection), width


def finish(sums: torch.Tensor, width: int) -> list[int]:
    """The row hashes from :func:`start`'s sums (the one host copy)."""
    return mix(sums.cpu().tolist(), width)


def mix(sums: list, width: int) -> list[int]:
    """The row hashes from :func:`start`'s sums copied to the host (a list of rows of four). The
    sums are exact integers below 2**52; each is spread over 64 bits by an odd multiplier and the
    four are xor-ed."""
    k0, k1, k2, k3 = _MULTIPLIERS
    seed = width * 0xFF51AFD7ED558CCD
    return [(seed ^ int(a) * k0 ^ int(b) * k1 ^ int(c) * k2 ^ int(d) * k3 ^ (int(a) >> 20) * k3) & _MASK63
            for a, b, c, d in sums]


def row_hashes(batch: torch.Tensor) -> Optional[list[int]]:
    """One hash per sampled row of ``batch`` (None when it is not a fingerprintable tensor)."""
    if not fingerprintable(batch):
        return None
    return finish(*start(batch))
