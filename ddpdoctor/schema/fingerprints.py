"""Wire form of a step's per-tensor fingerprints: one ASCII string per list.

``base64(float64 little-endian [norm, max] pairs)``, then ``"|"`` and the comma-separated positions
of tensors that had no value (a parameter without gradient) when there are any. Replicas in sync
write the same string, so the analysis compares whole steps as strings and keeps one copy of
each (see :func:`intern`): the fingerprints of a 1024-rank job then cost what one rank's do.
"""

from __future__ import annotations

import base64
from array import array
from typing import Optional, Sequence

__all__ = ["Fingerprint", "encode_fingerprints", "decode_fingerprints", "intern"]

Fingerprint = Optional[list]  # [norm, max], or None for a missing tensor


def encode_fingerprints(values: Sequence[Fingerprint]) -> str:
    flat = array("d")
    missing = []
    for i, value in enumerate(values):
        if value is None:
            missing.append(i)
            flat.extend((0.0, 0.0))
        else:
            flat.extend((float(value[0]), float(value[1])))
    if flat.itemsize != 8:  # pragma: no cover - every supported platform has 8-byte doubles
        raise RuntimeError("array('d') is not float64 here")
    if array("H", [1]).tobytes()[0] != 1:  # big-endian host: write little-endian like everyone else
        flat.byteswap()
    encoded = base64.b64encode(flat.tobytes()).decode("ascii")
    return encoded + ("|" + ",".join(map(str, missing)) if missing else "")


def decode_fingerprints(encoded: str) -> list[Fingerprint]:
    payload, _, missing_text = encoded.partition("|")
    flat = array("d")
    flat.frombytes(base64.b64decode(payload))
    if array("H", [1]).tobytes()[0] != 1:  # pragma: no cover
        flat.byteswap()
    values: list[Fingerprint] = [[flat[i], flat[i + 1]] for i in range(0, len(flat), 2)]
    for i in (int(x) for x in missing_text.split(",") if x):
        values[i] = None
    return values


def intern(encoded: Optional[str], pool: dict[str, str]) -> Optional[str]:
    """One shared copy of equal strings: identical replicas' fingerprints stored once."""
    return None if encoded is None else pool.setdefault(encoded, encoded)
