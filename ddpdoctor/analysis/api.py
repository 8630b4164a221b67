"""The contract between ddpdoctor and a check: evidence in, findings out.

A check is a :class:`Check` object exposed through the ``ddpdoctor.checks`` entry-point group.
Its ``analyze`` must be a pure function of the :class:`~ddpdoctor.evidence.Evidence`, so it can be
unit-tested on synthetic evidence and gives the same answer on 2 or 1024 ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

if TYPE_CHECKING:
    from ddpdoctor.evidence import Evidence

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class Location:
    file: str
    line: int

    @classmethod
    def from_site(cls, site: Any) -> Optional["Location"]:
        """From a probe's call site: a {file, line} dict or a list of them (innermost first)."""
        if isinstance(site, list):
            site = site[0] if site else None
        if isinstance(site, dict) and site.get("file") and site.get("line") is not None:
            return cls(file=site["file"], line=int(site["line"]))
        return None


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    message: str
    fix: str
    ranks: tuple[int, ...] = ()
    location: Optional[Location] = None
    evidence: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "severity": self.severity,
            "message": self.message,
            "ranks": sorted(self.ranks),
            "location": {"file": self.location.file, "line": self.location.line} if self.location else None,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass
class CheckResult:
    """What a check concluded. ``applicable=False`` means there was nothing to check (status skip)."""

    findings: list[Finding] = field(default_factory=list)
    summary: str = ""
    applicable: bool = True

    @property
    def status(self) -> str:
        if not self.applicable:
            return "skip"
        severities = {f.severity for f in self.findings}
        if "error" in severities:
            return "fail"
        if "warning" in severities:
            return "warn"
        return "pass"


@dataclass(frozen=True)
class Check:
    """A pluggable check: an id from the public list, a title, docs for ``explain``, an analyzer."""

    id: str
    title: str
    analyze: Callable[["Evidence"], CheckResult]
    docs: str
