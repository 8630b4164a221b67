"""Runs every check over the evidence; a check that crashes is reported, never fatal."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.check_api import CheckResult, Finding
from ddpdoctor.evidence import Evidence
from ddpdoctor.registry import LoadedCheck, load_checks


@dataclass
class CheckOutcome:
    id: str
    title: str
    result: CheckResult
    error: Optional[str] = None

    @property
    def status(self) -> str:
        return "skip" if self.error else self.result.status


def run_checks(evidence: Evidence, checks: Optional[list[LoadedCheck]] = None) -> list[CheckOutcome]:
    outcomes = []
    for loaded in checks if checks is not None else load_checks():
        if loaded.check is None:
            outcomes.append(_crashed(loaded.id, loaded.id, f"could not load: {loaded.error}"))
            continue
        try:
            result = loaded.check.analyze(evidence)
        except Exception:
            outcomes.append(_crashed(loaded.id, loaded.check.title, traceback.format_exc(limit=6)))
            continue
        outcomes.append(CheckOutcome(id=loaded.id, title=loaded.check.title, result=result))
    return outcomes


def _crashed(check_id: str, title: str, error: str) -> CheckOutcome:
    finding = Finding(
        check=check_id,
        severity="warning",
        message=f"the {check_id} check itself crashed, so it proved nothing",
        fix="Report this to the ddpdoctor maintainers with the evidence below.",
        evidence={"error": error},
    )
    result = CheckResult(findings=[finding], summary="check crashed", applicable=False)
    return CheckOutcome(id=check_id, title=title, result=result, error=error.strip().splitlines()[-1])


def all_findings(outcomes: list[CheckOutcome]) -> list[Finding]:
    order = {"error": 0, "warning": 1, "info": 2}
    findings = [f for o in outcomes for f in o.result.findings]
    return sorted(findings, key=lambda f: order[f.severity])
