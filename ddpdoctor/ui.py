"""Terminal output: a live per-rank view while the job runs, then the report (flutter-doctor style).

Plain, uncoloured lines when stdout is not a terminal or NO_COLOR is set, so CI logs stay readable.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

_GLYPHS = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red"), "skip": ("-", "dim")}
_PLAIN = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def is_plain() -> bool:
    return not sys.stdout.isatty() or bool(os.environ.get("NO_COLOR"))


def make_console(plain: bool) -> Console:
    if plain:
        return Console(no_color=True, highlight=False, emoji=False, soft_wrap=True, force_terminal=False)
    return Console(highlight=False, emoji=False)


class PlainDisplay:
    """Rank output as ``[rankN] line``; no live view."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        self.console = console
        self.show_output = show_output

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = f"[rank{rank}] " if rank is not None else ""
            self.console.print(Text(prefix + line), soft_wrap=True)

    def update(self, heartbeats: dict[int, dict], now: float) -> None:
        pass

    def notice(self, text: str) -> None:
        self.console.print(Text(f"ddpdoctor: {text}"))

    def close(self) -> None:
        pass


class LiveDisplay(PlainDisplay):
    """Rank output scrolls above a live table: rank, host, step, epoch, activity, heartbeat age."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        super().__init__(console, show_output=show_output)
        self._beats: dict[int, dict] = {}
        self._live = Live(self._table(time.time()), console=console, refresh_per_second=4, transient=True)
        self._live.start()

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = Text(f"[rank{rank}] ", style="dim cyan") if rank is not None else Text("")
            self._live.console.print(prefix + Text(line), soft_wrap=True)

    def update(self, heartbeats: dict[int, dict], now: float) -> None:
        self._beats = heartbeats
        self._live.update(self._table(now))

    def notice(self, text: str) -> None:
        self._live.console.print(Text(f"ddpdoctor: {text}", style="bold yellow"))

    def _table(self, now: float) -> Table:
        table = Table(title="ddpdoctor: ranks", title_justify="left", expand=False, box=None, padding=(0, 2))
        for column in ("rank", "host", "step", "epoch", "doing", "heartbeat"):
            table.add_column(column)
        for rank, beat in sorted(self._beats.items()):
            age = now - beat.get("t", now)
            site = beat.get("site") or {}
            doing = beat.get("activity", "")
            if site:
                doing += f" ({os.path.basename(site.get('file', ''))}:{site.get('line')})"
            table.add_row(str(rank), str(beat.get("host", "")), str(beat.get("steps", 0)),
                          "" if beat.get("epoch") is None else str(beat["epoch"]), doing,
                          Text(f"{age:.1f}s ago", style="red" if age > 5 else "green"))
        if not self._beats:
            table.add_row("…", "starting ranks", "", "", "", "")
        return table

    def close(self) -> None:
        self._live.stop()


def _evidence_lines(evidence: dict, limit: int = 8) -> list[str]:
    lines = []
    for key, value in evidence.items():
        if key in ("frames", "stacks"):
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > 160:
            text = text[:157] + "..."
        lines.append(f"{key}: {text}")
        if len(lines) >= limit:
            break
    return lines


def render_report(console: Console, report: dict, *, plain: bool) -> None:
    """One line per check, a panel per finding, then a one-line verdict."""
    console.print()
    console.print(Text(f"ddpdoctor {report['version']}: {report['script'] or 'reference job'} on "
                       f"{report['world_size']} ranks ({report['nnodes']} node{'s' if report['nnodes'] != 1 else ''}, "
                       f"{report['backend']}, {report['device']}), outcome {report['outcome']}, "
                       f"{report['duration_s']:.1f}s", style="bold"))
    if report["nnodes"] > 1:
        nodes: dict = {}
        for rank in report.get("ranks", []):
            nodes.setdefault(rank.get("node"), []).append(f"{rank['rank']} (local {rank.get('local_rank')})")
        console.print(Text("nodes: " + "; ".join(f"node {n}: ranks {', '.join(r)}" for n, r in sorted(
            nodes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))))
    for check in report["checks"]:
        status = check["status"]
        if plain:
            console.print(Text(f"[{_PLAIN[status]}] {check['id']}: {check['summary']}"))
        else:
            glyph, style = _GLYPHS[status]
            console.print(Text(f" {glyph} ", style=f"bold {style}") + Text(f"{check['id']:<18}", style="bold")
                          + Text(check["summary"], style="dim" if status in ("pass", "skip") else ""))
    for finding in report["findings"]:
        _render_finding(console, finding, plain=plain)
    console.print(Text(verdict(report), style="bold"))


def _render_finding(console: Console, finding: dict, *, plain: bool) -> None:
    location = finding.get("location")
    where = f"{location['file']}:{location['line']}" if location else None
    ranks = ", ".join(map(str, finding.get("ranks", [])))
    body = [Text(finding["message"])]
    if where:
        body.append(Text(f"at {where}"))
    if ranks:
        body.append(Text(f"ranks: {ranks}"))
    body.extend(Text(line, style="dim") for line in _evidence_lines(finding.get("evidence", {})))
    body.append(Text("fix: " + finding["fix"], style="" if plain else "green"))
    title = f"{finding['severity'].upper()} {finding['check']}"
    if plain:
        console.print(Text(title))
        for line in body:
            console.print(Text("    ") + line)
    else:
        console.print(Panel(Group(*body), title=title, title_align="left",
                            border_style=_SEVERITY_STYLE[finding["severity"]]))


def verdict(report: dict) -> str:
    counts = {s: sum(1 for f in report["findings"] if f["severity"] == s) for s in ("error", "warning", "info")}
    if counts["error"] or counts["warning"]:
        return (f"verdict: NOT OK: {counts['error']} error(s), {counts['warning']} warning(s), "
                f"{counts['info']} info")
    suffix = f" ({counts['info']} info)" if counts["info"] else ""
    return f"verdict: OK: every check passed or had nothing to check{suffix}"
