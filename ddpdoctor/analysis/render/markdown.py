"""The report as GitHub-flavoured Markdown, for $GITHUB_STEP_SUMMARY or a pull-request comment:
the verdict, a table of checks, then each top-level finding with its consequences and fix."""

from __future__ import annotations

from ddpdoctor.analysis.api import Finding, Location
from ddpdoctor.analysis.render.evidence import evidence_rows
from ddpdoctor.analysis.render.source import Sources, snippet, underline
from ddpdoctor.analysis.render.words import (consequence_of, device_simulation_line, duration_text, parallelism_line,
                                             verdict)
from ddpdoctor.analysis.report import Report
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, EvidenceRecord

__all__ = ["render_markdown"]

_STATUS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skip": "➖"}
_SEVERITY = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}
_CONSEQUENCE = "↪️"  # a check whose finding is another's consequence: never a pass mark


def _cell(text: str) -> str:
    """A table cell: a pipe or a newline would split the row."""
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _where(location: Location) -> str:
    return f"`{location.file}:{location.line}`"


def _code(location: Location, sources: Sources) -> list[str]:
    """The flagged source line (with its context) as a fenced block, when the report or the file has it."""
    found = snippet(location.file, location.line, sources=sources)
    if found is None:
        return []
    gutter = len(str(found.line))
    start, end = underline(found.text)
    body = [f"{number:>{gutter}} | {text}" for number, text in found.lines]
    return ["```python", *body, f"{' ' * gutter} | {' ' * start}{'^' * (end - start)}", "```", ""]


def _evidence(evidence: EvidenceRecord) -> list[str]:
    """The evidence in words (as the terminal shows it), one nested item per line of a row."""
    rows = evidence_rows(evidence)
    if not rows:
        return []
    lines = ["- **Evidence:**"]
    for label, values in rows:
        if len(values) == 1:
            lines.append(f"  - {label}: {values[0]}")
        else:
            lines += [f"  - {label}:", *(f"    - {value}" for value in values)]
    return lines


def _finding(finding: Finding, sources: Sources) -> list[str]:
    lines = [f"### {_SEVERITY[finding.severity]} {finding.severity.upper()} `{finding.check}`", "", finding.message, ""]
    if finding.location:
        lines += _code(finding.location, sources)
        lines.append(f"- **Location:** {_where(finding.location)}")
    if finding.ranks:
        lines.append(f"- **Ranks:** {', '.join(map(str, sorted(finding.ranks)))}")
    lines += _evidence(finding.evidence)
    lines.append(f"- **Fix:** {finding.fix}")
    if finding.consequences:
        lines.append("- **Consequences:**")
        for c in finding.consequences:
            at = f" at {_where(c.location)}" if c.location else ""
            lines.append(f"  - `{c.check}`: {c.message}{at}")
    return lines + [""]


def render_markdown(report: Report, *, fail_on: str = DEFAULT_FAIL_ON) -> str:
    nodes = f"{report.nnodes} node{'s' if report.nnodes != 1 else ''}"
    icon = "❌" if report.exit_code(fail_on) else "✅"
    lines = [f"## {icon} ddpdoctor {verdict(report, fail_on)}", "",
             f"`{report.script or 'reference job'}` on {report.world_size} ranks ({nodes}, {report.backend}, "
             f"{report.device}), outcome **{report.outcome}**, "
             f"{duration_text(report.duration_s, post_mortem=bool(report.post_mortem))}, ddpdoctor {report.version}",
             ""]
    for line in (parallelism_line(report.parallelism), device_simulation_line(report.device_simulation)):
        if line:
            lines += [line[0].upper() + line[1:], ""]
    lines += ["| | Check | Summary |", "|---|---|---|"]
    for check in report.checks:
        summary = check.summary + (f" (incomplete: probe {', '.join(check.incomplete)} failed)"
                                   if check.incomplete else "")
        status = _CONSEQUENCE if consequence_of(check, report.findings) else _STATUS.get(check.status, check.status)
        lines.append(f"| {status} | `{_cell(check.id)}` | {_cell(summary)} |")
    lines.append("")
    if report.findings:
        lines += ["## Findings", ""]
        for finding in report.findings:
            lines += _finding(finding, report.sources)
    return "\n".join(lines)
