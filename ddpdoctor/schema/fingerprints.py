"""Wire form of a step's per-tensor fingerprints: one ASCII string per list.

``"w:" + base64(int64 little-endian word sums)`` (see ddpdoctor/rank/fingerprint.py), then ``"|"``
and the comma-separated positions of tensors that had no value (a parameter without gradient) when
there are any. Evidence written before schema 4 holds ``base64(float64 [norm, max] pairs)`` without
the prefix; it still decodes. Replicas in sync write the same string, so the analysis compares whole
steps as strings and keeps one copy of each (see :func:`intern`): the fingerprints of a 1024-rank
job then cost what one rank's do.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Optional, Sequence, TypeVar

__all__ = ["Fingerprint", "encode_fingerprints", "decode_fingerprints", "intern"]

Fingerprint = Optional[list[float]]  # [word sum] (or, before schema 4, [norm, max]); None for a missing tensor

_WORDS = "w:"

_Number = TypeVar("_Number", int, float)


def _little_endian(values: array[_Number]) -> array[_Number]:
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        values.byteswap()
    return values


def encode_fingerprints(values: Sequence[Fingerprint]) -> str:
    words = array("q", [int(value[0]) if value is not None else 0 for value in values])
    missing = [i for i, value in enumerate(values) if value is None]
    encoded = _WORDS + base64.b64encode(_little_endian(words).tobytes()).decode("ascii")
    return encoded + ("|" + ",".join(map(str, missing)) if missing else "")


def decode_fingerprints(encoded: str) -> list[Fingerprint]:
    payload, _, missing_text = encoded.partition("|")
    values: list[Fingerprint]
    if payload.startswith(_WORDS):
        words = array("q")
        words.frombytes(base64.b64decode(payload[len(_WORDS):]))
        values = [[v] for v in _little_endian(words)]
    else:
        flat = array("d")
        flat.frombytes(base64.b64decode(payload))
        flat = _little_endian(flat)
        values = [[flat[i], flat[i + 1]] for i in range(0, len(flat), 2)]
    for i in (int(x) for x in missing_text.split(",") if x):
        values[i] = None
    return values


def intern(encoded: Optional[str], pool: dict[str, str]) -> Optional[str]:
    """One shared copy of equal strings: identical replicas' fingerprints stored once."""
    return None if encoded is None else pool.setdefault(encoded, encoded)
