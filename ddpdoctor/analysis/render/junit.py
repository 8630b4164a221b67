"""The report as JUnit XML, which every CI system shows as a test list: one test case per check,
failed when the check has a top-level finding at or above ``--fail-on`` (the exit-code rule)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ddpdoctor.analysis.api import SEVERITY_ORDER, Finding
from ddpdoctor.analysis.render.evidence import evidence_rows
from ddpdoctor.analysis.report import Report
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, EvidenceRecord

__all__ = ["render_junit"]

# Characters XML 1.0 cannot carry at all (NUL, ANSI escapes from a crashed rank's message...).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _where(finding: Finding) -> str:
    return f"{finding.location.file}:{finding.location.line}" if finding.location else "-"


def _ranks(finding: Finding) -> str:
    return ", ".join(map(str, sorted(finding.ranks))) or "-"


def _failure_text(finding: Finding) -> str:
    return "\n".join([f"{finding.severity} {finding.check}: {finding.message}", f"at {_where(finding)}",
                      f"ranks: {_ranks(finding)}", f"fix: {finding.fix}"])


def _evidence_lines(evidence: EvidenceRecord) -> list[str]:
    """The evidence in words, as the terminal shows it (the JSON report keeps it as data)."""
    rows = evidence_rows(evidence)
    if not rows:
        return []
    lines = ["  evidence:"]
    for label, values in rows:
        lines.append(f"    {label}: {values[0]}")
        lines += [f"    {' ' * len(label)}  {value}" for value in values[1:]]
    return lines


def _system_out(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines += [f"finding ({f.severity}): {f.message}", f"  ranks: {_ranks(f)}", f"  location: {_where(f)}",
                  *_evidence_lines(f.evidence)]
        for c in f.consequences:
            at = f" at {c.location.file}:{c.location.line}" if c.location else ""
            lines.append(f"  consequence ({c.check}): {c.message}{at}")
    return "\n".join(lines)


def render_junit(report: Report, *, fail_on: str = DEFAULT_FAIL_ON) -> str:
    """A ``<testsuites>`` document with one ``<testsuite name="ddpdoctor">``; the run's facts
    (world size, backend, versions...) as its properties, consequences and evidence in system-out."""
    threshold = SEVERITY_ORDER[fail_on]
    statuses = {c.id: c for c in report.checks}
    check_ids = list(dict.fromkeys([*statuses, *(f.check for f in report.findings)]))  # a finding always shows
    suite = ET.Element("testsuite", name="ddpdoctor")
    properties = ET.SubElement(suite, "properties")
    for name, value in [("world_size", report.world_size), ("nnodes", report.nnodes), ("backend", report.backend),
                        ("device", report.device), ("torch_version", report.torch_version),
                        ("python_version", report.python_version), ("outcome", report.outcome),
                        ("launch_mode", report.launch_mode), ("ddpdoctor_version", report.version)]:
        ET.SubElement(properties, "property", name=name, value=_clean(str(value)))
    failures = skipped = 0
    for check_id in check_ids:
        case = ET.SubElement(suite, "testcase", classname="ddpdoctor", name=check_id)
        findings = [f for f in report.findings if f.check == check_id]
        failing = [f for f in findings if SEVERITY_ORDER[f.severity] >= threshold]
        status = statuses.get(check_id)
        if failing:  # findings are most severe first
            failures += 1
            failure = ET.SubElement(case, "failure", message=_clean(failing[0].message), type=failing[0].severity)
            failure.text = _clean("\n\n".join(_failure_text(f) for f in failing))
        elif status is not None and status.status == "skip":
            skipped += 1
            reason = status.summary + (f": {status.error}" if status.error else "")
            ET.SubElement(case, "skipped", message=_clean(reason))
        if findings:
            ET.SubElement(case, "system-out").text = _clean(_system_out(findings))
    errors = 0
    if report.unchecked:  # ddpdoctor could not do its job: an error of the run, not a failure of a check
        errors = 1
        case = ET.SubElement(suite, "testcase", classname="ddpdoctor", name="probes")
        ET.SubElement(case, "error",
                      message=_clean(f"ddpdoctor could not check this job: {report.unchecked['reason']}"),
                      type="not-checked")
    counts = {"tests": str(len(check_ids) + errors), "failures": str(failures), "errors": str(errors),
              "skipped": str(skipped),
              "time": f"{report.duration_s:.3f}"}
    suite.attrib.update(counts)
    root = ET.Element("testsuites", {"name": "ddpdoctor", **counts})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
