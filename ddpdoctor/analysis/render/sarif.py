"""The report as SARIF 2.1.0, the format GitHub code scanning (and most CI dashboards) ingest: each
top-level finding becomes a result on its source line, its consequences related locations."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from ddpdoctor.analysis.api import Check, Finding, Location
from ddpdoctor.analysis.registry import load_checks
from ddpdoctor.analysis.report import Report
from ddpdoctor.schema.observations import Outcome

__all__ = ["SARIF_SCHEMA", "FINGERPRINT_KEY", "relative_path", "render_sarif"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# Versioned: if the recipe below ever changes, the key changes with it so old alerts are not mismatched.
FINGERPRINT_KEY = "ddpdoctorFinding/v1"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def relative_path(file: str, repo_root: str) -> Optional[str]:
    """``file`` relative to ``repo_root`` with forward slashes, or None when it lies outside it."""
    try:
        relative = os.path.relpath(os.path.abspath(file), os.path.abspath(repo_root))
    except ValueError:  # another drive on Windows
        return None
    if relative == ".." or relative.startswith(".." + os.sep):
        return None
    return Path(relative).as_posix()


def _artifact(file: str, repo_root: str) -> dict[str, Any]:
    relative = relative_path(file, repo_root)
    if relative is None:
        return {"uri": Path(os.path.abspath(file)).as_uri()}
    return {"uri": quote(relative), "uriBaseId": "SRCROOT"}


def _physical(location: Location, repo_root: str) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": _artifact(location.file, repo_root)}
    if location.line >= 1:
        physical["region"] = {"startLine": location.line}
    return physical


def _section(docs: str, heading: str) -> str:
    """The body of one "## heading" section of a check's markdown docs."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", docs, re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else ""


def _rule(check_id: str, title: str, check: Optional[Check]) -> dict[str, Any]:
    rule: dict[str, Any] = {"id": check_id,
                            "name": "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", check_id)),
                  "shortDescription": {"text": check.title if check else title},
                  # ddpdoctor's checks find correctness bugs; each result still carries its own level.
                  "defaultConfiguration": {"level": "error"}}
    if check is not None:
        rule["fullDescription"] = {"text": _section(check.docs, "What it does") or check.title}
        rule["help"] = {"text": check.docs, "markdown": check.docs}
    return rule


def _fingerprint(finding: Finding, repo_root: str) -> str:
    """Stable across runs: digits (steps, ranks, sizes) in the message do not change it."""
    file = line = ""
    if finding.location:
        file = relative_path(finding.location.file, repo_root) or finding.location.file
        line = str(finding.location.line)
    key = "\0".join([finding.check, file, line, re.sub(r"\d+", "0", finding.message)])
    return hashlib.sha256(key.encode()).hexdigest()


def _result(finding: Finding, rule_index: dict[str, int], repo_root: str) -> dict[str, Any]:
    result: dict[str, Any] = {"ruleId": finding.check, "ruleIndex": rule_index[finding.check],
                    "level": _LEVELS[finding.severity], "message": {"text": finding.message}}
    if finding.location:
        result["locations"] = [{"physicalLocation": _physical(finding.location, repo_root)}]
    related = [(c, c.location) for c in finding.consequences if c.location]
    if related:
        result["relatedLocations"] = [
            {"id": i, "physicalLocation": _physical(location, repo_root),
             "message": {"text": f"consequence ({c.check}): {c.message}"}}
            for i, (c, location) in enumerate(related, start=1)]
    result["partialFingerprints"] = {FINGERPRINT_KEY: _fingerprint(finding, repo_root)}
    result["properties"] = {"fix": finding.fix, "ranks": sorted(finding.ranks)}
    return result


def _invocation(report: Report) -> dict[str, Any]:
    """Whether the run finished and was checked; a job the probes could not check says why."""
    invocation: dict[str, Any] = {"executionSuccessful": report.outcome == Outcome.COMPLETED and not report.unchecked}
    if report.unchecked:
        invocation["toolExecutionNotifications"] = [{
            "level": "error", "message": {"text": f"ddpdoctor could not check this job: {report.unchecked['reason']}"}}]
    return invocation


def render_sarif(report: Report, *, repo_root: str) -> dict[str, Any]:
    """One run; file URIs relative to ``repo_root`` (uriBaseId SRCROOT) so code scanning can place
    results on the checked-out source, absolute file:// URIs for files outside it."""
    loaded = {c.id: c.check for c in load_checks() if c.check is not None}
    titles = {c.id: c.title for c in report.checks}
    for finding in report.findings:  # a finding always gets a rule, even for a check not in the list
        titles.setdefault(finding.check, finding.check)
    rules = [_rule(check_id, title, loaded.get(check_id)) for check_id, title in titles.items()]
    rule_index = {rule["id"]: i for i, rule in enumerate(rules)}
    root_uri = Path(os.path.abspath(repo_root)).as_uri()
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "ddpdoctor", "version": report.version,
                                "rules": rules}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root_uri if root_uri.endswith("/") else root_uri + "/"}},
            "invocations": [_invocation(report)],
            "results": [_result(f, rule_index, repo_root) for f in report.findings],
        }],
    }
