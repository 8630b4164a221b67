"""The contract between ddpdoctor and a check: evidence in, findings out.

A check is a :class:`Check` object exposed through the ``ddpdoctor.checks`` entry-point group
(third-party checks too: :mod:`ddpdoctor.plugin` is their versioned API). Its ``analyze`` must be a
pure function of the :class:`~ddpdoctor.analysis.evidence.Evidence`, so it can be unit-tested on
synthetic evidence and gives the same answer on 2 or 1024 ranks. Derived facts shared by several
checks are in :mod:`ddpdoctor.analysis.facts`; checks never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from ddpdoctor.schema.findings import (Consequence, EvidenceRecord, Finding, Location, Severity, Status,
                                       evidence_field, register_evidence)

if TYPE_CHECKING:
    from ddpdoctor.analysis.evidence import Evidence

__all__ = ["CHECK_API_VERSION", "Severity", "SEVERITY_ORDER", "Location", "Consequence", "Finding", "EvidenceRecord",
           "evidence_field", "CheckResult", "Check", "Explains", "RUN", "ENVIRONMENT", "POSTMORTEM"]

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
    def status(self) -> Status:
        return status_of(self.findings, applicable=self.applicable)


def status_of(findings: list[Finding], *, applicable: bool = True) -> Status:
    return Status.of({f.severity for f in findings}, applicable=applicable)


def _worth_explaining(finding: Finding) -> bool:
    return finding.severity in (Severity.ERROR, Severity.WARNING)


@dataclass(frozen=True)
class Explains:
    """A causal rule a check declares: its findings for which ``cause`` holds explain every other
    finding for which ``symptom(finding, cause)`` holds, which then hangs under it as a consequence.

    A symptom is recognised by the kind of its evidence (:mod:`ddpdoctor.analysis.symptoms`), never
    by another check's id, so a plugin check can be a cause, or a symptom, like a built-in one.
    ``priority``: rules are tried lowest first across all checks (a symptom goes to the first cause
    that explains it); built-in rules use 10-130.
    """

    name: str
    symptom: Callable[[Finding, Finding], bool]
    cause: Callable[[Finding], bool] = _worth_explaining
    priority: int = 1000


# What a check can be run on: a checked run, the `env` command's environment job, `analyze`'s
# post-mortem evidence (flight recorder dumps, error files).
RUN, ENVIRONMENT, POSTMORTEM = "run", "environment", "postmortem"


@dataclass(frozen=True)
class Check:
    """A pluggable check: an id from the public list, a title, docs for ``explain``, an analyzer, and
    everything else about it that ddpdoctor needs, declared here and nowhere else.

    ``probe``: "module:function" of an in-rank probe, ``install(rec) -> Optional[finalizer]``, that
    every rank runs before the script, as it does the built-in probes (for evidence no built-in
    probe records). ``probes``: the built-in probes whose evidence it reads (ddpdoctor.schema.probes),
    so a probe that failed marks it incomplete. ``evidence``: the types of its findings' evidence, so a
    saved report's comes back typed. ``explains``: the findings of other checks its findings explain.
    ``order``: its place in ``list-checks``, ``explain`` and the report (built-ins 10-140, plugins
    after). ``sources``: what it can judge (``RUN``, ``ENVIRONMENT``, ``POSTMORTEM``).
    ``api_version``: the version of this contract the check was written for.
    """

    id: str
    title: str
    analyze: Callable[["Evidence"], CheckResult]
    docs: str
    probe: Optional[str] = None
    api_version: int = 1
    probes: tuple[str, ...] = ()
    evidence: tuple[type[EvidenceRecord], ...] = ()
    explains: tuple[Explains, ...] = ()
    order: int = 1000
    sources: frozenset[str] = frozenset({RUN})

    def __post_init__(self) -> None:
        if self.evidence:
            register_evidence(self.id, self.evidence)
