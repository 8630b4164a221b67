"""Small helpers shared by the built-in checks (pure functions of evidence)."""

from __future__ import annotations

from typing import Iterable, Optional

from ddpdoctor.check_api import Location
from ddpdoctor.compare import differs
from ddpdoctor.evidence import Evidence


def fmt_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def short_site(location: Optional[Location]) -> str:
    if location is None:
        return "an unknown place"
    return f"{location.file.rsplit('/', 1)[-1]}:{location.line}"


def first_site(evidence: Evidence, kind: str, **match) -> Optional[Location]:
    for _, event in evidence.events(kind):
        if all(event.get(k) == v for k, v in match.items()):
            location = Location.from_site(event.get("site"))
            if location:
                return location
    return None


def group_by_value(values: dict[int, list]) -> list[list[int]]:
    """Ranks grouped by equal fingerprints (within tolerance), largest group first."""
    groups: list[tuple[list, list[int]]] = []
    for rank in sorted(values):
        for value, members in groups:
            if not differs(value, values[rank]):
                members.append(rank)
                break
        else:
            groups.append((values[rank], [rank]))
    return [members for _, members in sorted(groups, key=lambda g: (-len(g[1]), g[1][0]))]
