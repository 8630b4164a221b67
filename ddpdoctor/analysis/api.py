"""The contract between ddpdoctor and a check: evidence in, findings out.

A check is a :class:`Check` object exposed through the ``ddpdoctor.checks`` entry-point group
(third-party checks too: :mod:`ddpdoctor.plugin` is their versioned API). Its ``analyze`` must be a
pure function of the :class:`~ddpdoctor.analysis.evidence.Evidence`, so it can be unit-tested on
synthetic evidence and gives the same answer on 2 or 1024 ranks. Derived facts shared by several
checks are in ``evidence.facts``; checks never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

if TYPE_CHECKING:
    from ddpdoctor.analysis.evidence import Evidence

__all__ = ["CHECK_API_VERSION", "Severity", "SEVERITY_ORDER", "Location", "Consequence", "Finding", "CheckResult",
           "Check"]

# The version of this contract; a check declaring another one is reported as broken, not run.
CHECK_API_VERSION = 1

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

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line}


@dataclass(frozen=True)
class Consequence:
    """A symptom explained by a root-cause finding: shown under it, never counted on its own."""

    check: str
    message: str
    ranks: tuple[int, ...] = ()
    location: Optional[Location] = None
    evidence: dict = field(default_factory=dict)
    severity: Severity = "error"  # what the check would have said on its own

    def to_json(self) -> dict:
        return {"check": self.check, "message": self.message, "ranks": sorted(self.ranks),
                "location": self.location.to_json() if self.location else None, "evidence": self.evidence,
                "severity": self.severity}

    @classmethod
    def from_json(cls, data: dict) -> "Consequence":
        """Back from :meth:`to_json`, so a saved report can be rendered again (unknown keys ignored)."""
        return cls(check=data["check"], message=data["message"], ranks=tuple(data.get("ranks", ())),
                   location=Location.from_site(data.get("location")), evidence=data.get("evidence") or {},
                   severity=data.get("severity", "error"))


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    message: str
    fix: str
    ranks: tuple[int, ...] = ()
    location: Optional[Location] = None
    evidence: dict = field(default_factory=dict)
    consequences: tuple[Consequence, ...] = ()

    def as_consequence(self) -> Consequence:
        return Consequence(check=self.check, message=self.message, ranks=self.ranks, location=self.location,
                           evidence=self.evidence, severity=self.severity)

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "severity": self.severity,
            "message": self.message,
            "ranks": sorted(self.ranks),
            "location": self.location.to_json() if self.location else None,
            "evidence": self.evidence,
            "fix": self.fix,
            "consequences": [c.to_json() for c in self.consequences],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Finding":
        """Back from :meth:`to_json`, so a saved report can be rendered again (unknown keys ignored)."""
        return cls(check=data["check"], severity=data["severity"], message=data["message"], fix=data["fix"],
                   ranks=tuple(data.get("ranks", ())), location=Location.from_site(data.get("location")),
                   evidence=data.get("evidence") or {},
                   consequences=tuple(Consequence.from_json(c) for c in data.get("consequences", ())))


@dataclass
class CheckResult:
    """What a check concluded. ``applicable=False`` means there was nothing to check (status skip)."""

    findings: list[Finding] = field(default_factory=list)
    summary: str = ""
    applicable: bool = True

    @property
    def status(self) -> str:
        return status_of(self.findings, applicable=self.applicable)


def status_of(findings: list[Finding], *, applicable: bool = True) -> str:
    if not applicable:
        return "skip"
    severities = {f.severity for f in findings}
    if "error" in severities:
        return "fail"
    if "warning" in severities:
        return "warn"
    return "pass"


@dataclass(frozen=True)
class Check:
    """A pluggable check: an id from the public list, a title, docs for ``explain``, an analyzer.

    ``probe``: "module:function" of an in-rank probe, ``install(rec) -> Optional[finalizer]``, that
    every rank runs before the script, as it does the built-in probes (for evidence no built-in
    probe records). ``api_version``: the version of this contract the check was written for.
    """

    id: str
    title: str
    analyze: Callable[["Evidence"], CheckResult]
    docs: str
    probe: Optional[str] = None
    api_version: int = 1
