"""Discovers checks through the ``ddpdoctor.checks`` entry-point group (built-ins included)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Optional

from ddpdoctor.analysis.api import Check

GROUP = "ddpdoctor.checks"


@dataclass
class LoadedCheck:
    """A check, or why its entry point failed to load (a broken plugin never aborts a run)."""

    id: str
    check: Optional[Check]
    error: Optional[str] = None


def load_checks() -> list[LoadedCheck]:
    loaded: dict[str, LoadedCheck] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in loaded:
            continue
        try:
            check = ep.load()
            if not isinstance(check, Check):
                raise TypeError(f"{ep.value} is a {type(check).__name__}, not a ddpdoctor.Check")
            loaded[ep.name] = LoadedCheck(id=ep.name, check=check)
        except Exception as exc:
            loaded[ep.name] = LoadedCheck(id=ep.name, check=None, error=f"{type(exc).__name__}: {exc}")
    return [loaded[k] for k in sorted(loaded, key=_builtin_order)]


_BUILTIN_ORDER = [
    "gradient-sync", "buffer-sync", "sampler-disjoint", "set-epoch", "unused-parameters",
    "collective-hang", "uneven-inputs", "rank0-checkpoint", "rank-failure", "not-distributed",
]


def _builtin_order(check_id: str) -> tuple[int, str]:
    return (_BUILTIN_ORDER.index(check_id) if check_id in _BUILTIN_ORDER else len(_BUILTIN_ORDER), check_id)


def find_check(check_id: str) -> Optional[LoadedCheck]:
    return next((c for c in load_checks() if c.id == check_id), None)
