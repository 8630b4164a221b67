"""Compact encoding of sample-index multisets: sorted deltas, zlib, base64. Pure Python."""

from __future__ import annotations

import base64
import hashlib
import zlib
from array import array


def encode_indices(indices: list[int]) -> str:
    """Sorted indices (duplicates kept) as zlib-compressed deltas in base64."""
    ordered = sorted(indices)
    deltas = array("q", (b - a for a, b in zip([0] + ordered[:-1], ordered)))
    return base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode("ascii")


def decode_indices(encoded: str) -> list[int]:
    """Inverse of :func:`encode_indices`: the sorted index list."""
    deltas = array("q")
    deltas.frombytes(zlib.decompress(base64.b64decode(encoded)))
    out, total = [], 0
    for d in deltas:
        total += d
        out.append(total)
    return out


def order_hash(indices: list[int]) -> str:
    """Digest of the visiting order, to tell whether two passes shuffled the same way."""
    return hashlib.blake2b(array("q", indices).tobytes(), digest_size=8).hexdigest()
