"""Sample fingerprints: one 63-bit hash per row of a batch, equal wherever the row's bits are equal.

Why not a float projection of the values: a float GEMM's rounding depends on how the library
blocks it (batch size, device, kernel), so the same sample in two batches could fingerprint
differently. Here each element's bit pattern, read as an integer (8-byte elements folded to 32
bits), is projected with a fixed matrix of integers below 2**10, in float64: every partial sum is
an integer below 2**52, so the result is exact whatever the summation order, batch size or device.
Four projections are mixed into one hash on the tensor's device, in wrapping int64 arithmetic,
and reach the host in one copy per batch.

Sampling, so the cost stays flat on large batches: at most ``MAX_ROWS`` rows (a fixed stride over
the batch dimension) and ``MAX_FEATURES`` elements per row (a fixed stride over the flattened row).
Two different rows that agree on every sampled element get the same hash.

The projection comes from a private ``torch.Generator`` with a fixed seed: identical on every rank
and never touching the script's RNG. Nothing is written in place; no autograd graph is built.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["MAX_ROWS", "MAX_FEATURES", "fingerprintable", "row_hashes", "start", "finish"]

MAX_ROWS = 256
MAX_FEATURES = 1024  # elements below 2**32 in magnitude, weights below 2**10: sums stay below 2**52
NUM_PROJECTIONS = 4
_SEED = 0x5EED_D0C7
_MASK63 = (1 << 63) - 1
_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
_WIDTH_MULTIPLIER = 0xFF51AFD7ED558CCD
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# device -> (the projection, transposed: NUM_PROJECTIONS x MAX_FEATURES float64; the multipliers as int64)
_constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_scratch: dict[tuple, torch.Tensor] = {}  # row-block shape -> a CPU float64 buffer (see start)


def _signed64(value: int) -> int:
    """``value`` modulo 2**64 as a signed 64-bit integer: the same low 64 bits, which are all that
    wrapping int64 arithmetic keeps."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _device_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    found = _constants.get(device)
    if found is None:
        generator = torch.Generator().manual_seed(_SEED)
        weights = torch.randint(1, 1 << 10, (MAX_FEATURES, NUM_PROJECTIONS), generator=generator)
        # Kept transposed and multiplied as ``.t()``: MKL's float64 GEMM of a batch's rows by a
        # transposed operand took 47 us against 98 for 64 rows of 1024 (the sums are exact either way).
        projection = weights.t().contiguous().to(torch.float64).to(device)
        multipliers = torch.tensor([_signed64(k) for k in _MULTIPLIERS], dtype=torch.int64).to(device)
        found = _constants[device] = (projection, multipliers)
    return found


def fingerprintable(tensor: object) -> bool:
    """A dense tensor with a batch dimension, not a model output (those carry autograd history)."""
    return (isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 and tensor.shape[0] > 0 and tensor.numel() > 0
            and tensor.layout == torch.strided and not tensor.is_complex() and not tensor.is_meta
            and not tensor.requires_grad)


@torch.no_grad()
def start(batch: torch.Tensor) -> torch.Tensor:
    """Launch the hashes of ``batch``'s sampled rows on its own device (an int64 tensor, one per row)."""
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
    projection, multipliers = _device_constants(batch.device)
    projection = projection[:, : bits.shape[1]].t()
    if bits.device.type != "cpu":
        return _mixed(bits.to(torch.float64) @ projection, width, multipliers)
    # On a CPU, the float64 copy goes into a buffer kept between batches: a fresh one of this size
    # (512 KiB for 64 rows of 1024) is mapped anew by the allocator, and its page faults cost three
    # times the projection. (Not on a GPU: there a kept buffer could race with another stream.)
    scratch = _scratch.get(tuple(bits.shape))
    if scratch is None:
        if len(_scratch) >= 4:
            _scratch.clear()
        scratch = _scratch[tuple(bits.shape)] = torch.empty(bits.shape, dtype=torch.float64)
    return _mixed(torch.mm(scratch.copy_(bits), projection), width, multipliers)


def _mixed(sums: torch.Tensor, width: int, multipliers: torch.Tensor) -> torch.Tensor:
    """One hash per row of four projections: the sums (exact integers below 2**52 in magnitude) each
    spread over 64 bits by an odd multiplier, xor-ed with each other, with the first one's high bits
    and with the row width, kept to 63 bits. In wrapping int64 arithmetic, a dozen small kernels in
    place of a Python loop over the rows (63 us for 64 rows on a CPU): the same low 63 bits as the
    exact integers' (``tests/unit/test_row_hashes.py`` checks it against them)."""
    words = sums.to(torch.int64)
    spread = words * multipliers
    first = words[:, 0]
    hashes = spread[:, 0] ^ spread[:, 1] ^ spread[:, 2] ^ spread[:, 3] ^ ((first >> 20) * multipliers[3])
    return (hashes ^ _signed64(width * _WIDTH_MULTIPLIER)) & _MASK63


def finish(hashes: torch.Tensor) -> list[int]:
    """The row hashes from :func:`start` on the host (the one copy)."""
    return hashes.tolist()


def row_hashes(batch: torch.Tensor) -> Optional[list[int]]:
    """One hash per sampled row of ``batch`` (None when it is not a fingerprintable tensor)."""
    if not fingerprintable(batch):
        return None
    return finish(start(batch))
