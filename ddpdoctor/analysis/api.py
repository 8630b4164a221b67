"""The contract between ddpdoctor and a check: evidence in, findings out.

A check is a :class:`Check` object exposed through the ``ddpdoctor.checks`` entry-point group
(third-party checks too: :mod:`ddpdoctor.plugin` is their versioned API). Its ``analyze`` must be a
pure function of the :class:`~ddpdoctor.analysis.evidence.Evidence`, so it can be unit-tested on
synthetic evidence and gives the same answer on 2 or 1024 ranks. Derived facts shared by several
checks are in ``evidence.facts``; checks never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from ddpdoctor.schema.findings import Consequence, EvidenceRecord, Finding, Location, Severity, evidence_field

if TYPE_CHECKING:
    from ddpdoctor.analysis.evidence import Evidence

__all__ = ["CHECK_API_VERSION", "Severity", "SEVERITY_ORDER", "Location", "Consequence", "Finding", "EvidenceRecord",
           "evidence_field", "CheckResult", "Check"]

# The version of this contract; a check declaring another one is reported as broken, not run.
CHECK_API_VERSION = 1

# Severity's order, for callers that sort by it (Severity.rank says the same).
SEVERITY_ORDER: dict[str, int] = {s.value: s.rank for s in Severity}


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
