"""A fact of an Evidence computed once: on first use, then cached in the evidence's ``derived`` field.

:class:`~ddpdoctor.analysis.evidence.Evidence` declares that field and knows nothing of what goes in
it; whoever changes the events of an evidence in place afterwards calls :func:`forget`.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar, cast

from ddpdoctor.analysis.evidence import Evidence

__all__ = ["derived", "forget"]

T = TypeVar("T")


def derived(fact: Callable[[Evidence], T]) -> Callable[[Evidence], T]:
    """``fact(evidence)`` computed once per evidence (keyed by the fact's module and name)."""
    key = f"{fact.__module__}.{fact.__qualname__}"

    @functools.wraps(fact)
    def cached(evidence: Evidence) -> T:
        cache = evidence.derived
        try:
            return cast(T, cache[key])
        except KeyError:
            value = cache[key] = fact(evidence)
            return value

    return cached


def forget(evidence: Evidence) -> None:
    """Drop every fact derived from ``evidence`` so far (its events were changed in place)."""
    evidence.derived.clear()
