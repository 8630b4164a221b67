"""Runs every check over the evidence, then the causality pass; a check that crashes is reported,
never fatal."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from ddpdoctor.analysis import causality, interruption, suppression
from ddpdoctor.analysis.api import SEVERITY_ORDER, CheckResult, Finding, status_of
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.registry import LoadedCheck, load_checks
from ddpdoctor.schema.events import ProbeError
from ddpdoctor.schema.findings import RawEvidence, Severity, Status
from ddpdoctor.schema.probes import ALL_CHECKS, checks_affected, not_checked_by


@dataclass
class CheckOutcome:
    """One check after the causality pass: its status counts only its top-level findings."""

    id: str
    title: str
    result: CheckResult
    error: Optional[str] = None  # the check itself crashed
    status: Status = Status.SKIP
    summary: str = ""
    incomplete: list[str] = field(default_factory=list)  # probes that failed, leaving this check blind
    consequence_of: Optional[str] = None  # its findings are symptoms of this check's root finding


@dataclass
class Analysis:
    outcomes: list[CheckOutcome]
    findings: list[Finding]  # root causes and independent problems, consequences attached
    probe_errors: list[dict[str, Any]]
    suppressed: list[tuple[Finding, suppression.Suppression]] = field(default_factory=list)
    unused_suppressions: list[suppression.Suppression] = field(default_factory=list)
    left_out: Optional[interruption.LeftOut] = None  # an interrupted run: what the stop cut off, not judged
    # {"reason", "ranks"}: the probes could not install, so nothing was checked (exit code 2, no finding)
    unchecked: Optional[dict[str, Any]] = None


def analyze(evidence: Evidence, checks: Optional[list[LoadedCheck]] = None, *,
            suppressions: Optional[list[suppression.Suppression]] = None) -> Analysis:
    checks = checks if checks is not None else load_checks()
    probe_errors = _probe_errors(evidence, {c.id: c.check.probes for c in checks if c.check is not None})
    unchecked = _unchecked(probe_errors)
    if unchecked is not None:
        return _not_checked(checks, probe_errors, unchecked)
    left_out = None
    if evidence.outcome == "interrupted":  # before the checks: no check sees the cut-off counts
        left_out = interruption.leave_out_cut_off(evidence)
    outcomes = [_run_one(loaded, evidence) for loaded in checks]
    raw = [f for o in outcomes for f in o.result.findings]
    roots, suppressed, unused = suppression.apply(causality.link(raw, causality.rules_for(checks)), suppressions or [])
    reasons = {f.check: s.reason for f, s in suppressed}
    explained_by = {c.check: r.check for r in roots for c in r.consequences}
    for outcome in outcomes:
        top = [f for f in roots if f.check == outcome.id]
        outcome.status = Status.SKIP if outcome.error else status_of(top, applicable=outcome.result.applicable)
        outcome.summary = outcome.result.summary
        if outcome.result.findings and not top and outcome.id in explained_by:
            outcome.summary += f" (a consequence of {explained_by[outcome.id]}, reported there)"
            outcome.consequence_of = explained_by[outcome.id]
        elif outcome.result.findings and not top and outcome.id in reasons:
            outcome.summary += f" (suppressed inline: {reasons[outcome.id] or 'no reason given'})"
        outcome.incomplete = [p["probe"] for p in probe_errors
                              if ALL_CHECKS in p["checks"] or outcome.id in p["checks"]]
    ordered = sorted(roots, key=lambda f: -SEVERITY_ORDER[f.severity])
    return Analysis(outcomes=outcomes, findings=ordered, probe_errors=probe_errors, suppressed=suppressed,
                    unused_suppressions=unused, left_out=left_out)


def _unchecked(probe_errors: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """Why nothing could be checked (an essential probe did not install on some rank), or None."""
    failed = [p for p in probe_errors if not_checked_by(p["probe"], p["phase"])]
    if not failed:
        return None
    ranks = sorted({r for p in failed for r in p["ranks"]})
    first = failed[0]
    if first["target"] == "import hook":  # ddpdoctor's own words: no exception type to show
        reason = first["error"].partition(": ")[2] or first["error"]
    else:
        reason = f"probe {first['probe']} could not install ({first['error']})"
    return {"reason": reason, "ranks": ranks}


def _not_checked(checks: list[LoadedCheck], probe_errors: list[dict[str, Any]], unchecked: dict[str, Any]) -> Analysis:
    """Every check skipped, no finding: a script the probes did not see is not judged."""
    outcomes = []
    for loaded in checks:
        title = loaded.check.title if loaded.check is not None else loaded.id
        outcome = CheckOutcome(id=loaded.id, title=title, result=CheckResult(applicable=False))
        outcome.summary = "not checked: the probes could not install"
        outcome.incomplete = [p["probe"] for p in probe_errors if ALL_CHECKS in p["checks"] or loaded.id in p["checks"]]
        outcomes.append(outcome)
    return Analysis(outcomes=outcomes, findings=[], probe_errors=probe_errors, unchecked=unchecked)


def select_checks(checks: list[LoadedCheck], select: Iterable[str] = (),
                  ignore: Iterable[str] = ()) -> list[LoadedCheck]:
    """The checks --select/--ignore keep; an unknown id is a ValueError naming the known ones."""
    known = [c.id for c in checks]
    for check_id in [*select, *ignore]:
        if check_id not in known:
            raise ValueError(f"unknown check id {check_id!r}; known: {', '.join(known)}")
    chosen = set(select) or set(known)
    return [c for c in checks if c.id in chosen and c.id not in set(ignore)]


def _run_one(loaded: LoadedCheck, evidence: Evidence) -> CheckOutcome:
    if loaded.check is None:
        return _crashed(loaded.id, loaded.id, f"could not load: {loaded.error}")
    try:
        result = loaded.check.analyze(evidence)
    except Exception:
        return _crashed(loaded.id, loaded.check.title, traceback.format_exc(limit=6))
    return CheckOutcome(id=loaded.id, title=loaded.check.title, result=result)


def _crashed(check_id: str, title: str, error: str) -> CheckOutcome:
    finding = Finding(
        check=check_id,
        severity=Severity.WARNING,
        message=f"the {check_id} check itself crashed, so it proved nothing",
        fix="Report this to the ddpdoctor maintainers with the evidence below.",
        evidence=RawEvidence({"error": error}),
    )
    result = CheckResult(findings=[finding], summary="check crashed", applicable=False)
    return CheckOutcome(id=check_id, title=title, result=result, error=error.strip().splitlines()[-1])


def _probe_errors(evidence: Evidence, declared: Mapping[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    """Probe failures, one entry per probe and error, with the ranks that saw it."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    events = [*evidence.events(ProbeError), *((None, e) for e in evidence.unranked if isinstance(e, ProbeError))]
    for rank, event in events:
        key = (event.probe, event.target or "", event.error)
        entry = merged.setdefault(key, {"probe": event.probe, "target": event.target, "error": event.error,
                                        "phase": event.phase, "ranks": [],
                                        "checks": list(checks_affected(event.probe, declared))})
        if rank is not None and rank not in entry["ranks"]:
            entry["ranks"].append(rank)
    return list(merged.values())
