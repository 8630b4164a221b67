"""The report in a terminal, flutter-doctor style: one line per check, a panel per finding with its
consequences under it, then a one-line verdict. Plain lines when colour is off."""

from __future__ import annotations

import json

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ddpdoctor.analysis.report import Report

_GLYPHS = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red"), "skip": ("-", "dim")}
_PLAIN = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
_HIDDEN_EVIDENCE = ("frames", "stacks", "stack", "fingerprints")


def _evidence_lines(evidence: dict, limit: int = 8) -> list[str]:
    lines = []
    for key, value in evidence.items():
        if key in _HIDDEN_EVIDENCE or value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > 160:
            text = text[:157] + "..."
        lines.append(f"{key}: {text}")
        if len(lines) >= limit:
            break
    return lines


def _where(location: dict | None) -> str | None:
    return f"{location['file']}:{location['line']}" if location else None


def render(console: Console, report: Report, *, plain: bool, fail_on: str = "warning") -> None:
    data = report.to_json()
    console.print()
    console.print(Text(f"ddpdoctor {data['version']}: {data['script'] or 'reference job'} on "
                       f"{data['world_size']} ranks ({data['nnodes']} node{'s' if data['nnodes'] != 1 else ''}, "
                       f"{data['backend']}, {data['device']}), outcome {data['outcome']}, "
                       f"{data['duration_s']:.1f}s", style="bold"))
    if data["nnodes"] > 1:
        nodes: dict = {}
        for rank in data.get("ranks", []):
            nodes.setdefault(rank.get("node"), []).append(f"{rank['rank']} (local {rank.get('local_rank')})")
        console.print(Text("nodes: " + "; ".join(f"node {n}: ranks {', '.join(r)}" for n, r in sorted(
            nodes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))))
    for check in data["checks"]:
        status = check["status"]
        summary = check["summary"] + (f" [incomplete: probe {', '.join(check['incomplete'])} failed]"
                                      if check.get("incomplete") else "")
        if plain:
            console.print(Text(f"[{_PLAIN[status]}] {check['id']}: {summary}"))
        else:
            glyph, style = _GLYPHS[status]
            console.print(Text(f" {glyph} ", style=f"bold {style}") + Text(f"{check['id']:<18}", style="bold")
                          + Text(summary, style="dim" if status in ("pass", "skip") else ""))
    for finding in data["findings"]:
        _render_finding(console, finding, plain=plain)
    for problem in data.get("probe_errors", []):
        console.print(Text(f"ddpdoctor: probe {problem['probe']} failed ({problem['error']}) on ranks "
                           f"{problem['ranks'] or '-'}; checks left incomplete: {', '.join(problem['checks'])}",
                           style="yellow"))
    console.print(Text(verdict(report, fail_on), style="bold"))


def _render_finding(console: Console, finding: dict, *, plain: bool) -> None:
    where = _where(finding.get("location"))
    ranks = ", ".join(map(str, finding.get("ranks", [])))
    body = [Text(finding["message"])]
    if where:
        body.append(Text(f"at {where}"))
    if ranks:
        body.append(Text(f"ranks: {ranks}"))
    body.extend(Text(line, style="dim") for line in _evidence_lines(finding.get("evidence", {})))
    for consequence in finding.get("consequences", []):
        at = _where(consequence.get("location"))
        body.append(Text(f"consequence ({consequence['check']}): {consequence['message']}"
                         + (f" at {at}" if at else ""), style="" if plain else "magenta"))
    body.append(Text("fix: " + finding["fix"], style="" if plain else "green"))
    title = f"{finding['severity'].upper()} {finding['check']}"
    if plain:
        console.print(Text(title))
        for line in body:
            console.print(Text("    ") + line)
    else:
        console.print(Panel(Group(*body), title=title, title_align="left",
                            border_style=_SEVERITY_STYLE[finding["severity"]]))


def verdict(report: Report, fail_on: str = "warning") -> str:
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in ("error", "warning", "info")}
    tally = f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"
    if report.exit_code(fail_on):
        return f"verdict: NOT OK: {tally}"
    if counts["error"] or counts["warning"]:
        return f"verdict: OK at --fail-on {fail_on}: {tally}"
    suffix = f" ({counts['info']} info)" if counts["info"] else ""
    return f"verdict: OK: every check passed or had nothing to check{suffix}"
