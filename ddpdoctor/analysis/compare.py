"""Cross-rank comparison of fingerprints; pure Python so analyzers run without torch."""

from __future__ import annotations

import math
from typing import Optional

from ddpdoctor.schema.fingerprints import Fingerprint

RTOL = 1e-6  # identical replicas agree to the bit; this only absorbs float32 rounding of equal values


def exact(value: Fingerprint) -> bool:
    """Word sums (ints) compare exactly; older float fingerprints within a tolerance."""
    return value is not None and all(isinstance(x, int) for x in value)


def differs(a: Fingerprint, b: Fingerprint, *, rtol: float = RTOL) -> bool:
    """Whether two fingerprints come from different tensors (None vs value counts as different)."""
    if a is None or b is None:
        return (a is None) != (b is None)
    if exact(a) or exact(b):
        return list(a) != list(b)
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            if not (x == y or (math.isnan(x) and math.isnan(y))):  # NaN or inf on one side only
                return True
        elif abs(x - y) > rtol * max(abs(x), abs(y), 1e-12):
            return True
    return False


def relative_difference(a: Fingerprint, b: Fingerprint) -> Optional[float]:
    """Largest relative difference between two float fingerprints, for the report; None for word
    sums, which say that the bits differ, not by how much."""
    if a is None or b is None:
        return float("inf")
    if exact(a) or exact(b):
        return None
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def group_by_value(values: dict[int, Fingerprint]) -> list[list[int]]:
    """Ranks grouped by equal fingerprints (within tolerance), largest group first."""
    groups: list[tuple[Fingerprint, list[int]]] = []
    for rank in sorted(values):
        for value, members in groups:
            if not differs(value, values[rank]):
                members.append(rank)
                break
        else:
            groups.append((values[rank], [rank]))
    return [members for _, members in sorted(groups, key=lambda g: (-len(g[1]), g[1][0]))]
