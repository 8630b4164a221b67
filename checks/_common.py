"""Small helpers shared by the built-in checks (pure functions of evidence)."""

from __future__ import annotations

from typing import Iterable, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import CheckResult, Location
from ddpdoctor.analysis.evidence import Evidence


def fmt_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def short_site(location: Optional[Location]) -> str:
    if location is None:
        return "an unknown place"
    return f"{location.file.rsplit('/', 1)[-1]}:{location.line}"


def first_site(evidence: Evidence, kind: type) -> Optional[Location]:
    """Where the first event of ``kind`` that has a call site was made."""
    for _, event in evidence.events(kind):
        location = Location.from_site(getattr(event, "site", None))
        if location:
            return location
    return None


def sharded_skip(evidence: Evidence) -> Optional[CheckResult]:
    """A skip that says so, for a check comparing DDP replicas, when the model is sharded (FSDP2,
    HSDP, FSDP1) and no DDP module exists: its evidence (each rank's shard) is not a replica."""
    found = facts.ddp.sharded_without_ddp(evidence)
    if found is None:
        return None
    return CheckResult(summary=f"the model is sharded with {found.describe()}: this check compares DDP replicas "
                               f"and does not check sharded models yet", applicable=False)
