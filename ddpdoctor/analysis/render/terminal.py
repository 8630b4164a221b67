"""The report in a terminal, flutter-doctor style: one line per check, a panel per finding with its
consequences under it, then a one-line verdict. Plain lines when colour is off."""

from __future__ import annotations

import json

from typing import Optional

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis.report import Report, device_simulation_line

_GLYPHS = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red"), "skip": ("-", "dim")}
_PLAIN = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
# Evidence kept for --json but not worth a line in the terminal.
_HIDDEN_EVIDENCE = {"frames", "stacks", "stack", "fingerprints", "kind", "seq", "secondary_only", "reduction_error",
                    "failed_ranks", "rank_groups", "calls", "site", "timeline", "ranks", "rank", "sequence",
                    "first_divergence", "threshold_s", "decoded", "secondary", "message", "exception"}


def _text(value) -> str:
    if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
        return ", ".join(f"rank {k}: {_text(v)}" for k, v in sorted(value.items(), key=lambda kv: int(kv[0])))
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(map(str, value))
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _evidence_lines(evidence: dict, limit: int = 8) -> list[str]:
    lines = []
    for key, value in evidence.items():
        if key in _HIDDEN_EVIDENCE or value is None or value == [] or value == {}:
            continue
        text = _text(value)
        if len(text) > 160:
            text = text[:157] + "..."
        lines.append(f"{key.replace('_', ' ')}: {text}")
        if len(lines) >= limit:
            break
    return lines


def _rank_table(states: dict) -> Optional[Table]:
    """Rank, state, what it waits in, where, last collective, stalled for: one row per rank."""
    if not isinstance(states, dict) or not states or not all(isinstance(s, dict) and "state" in s
                                                             for s in states.values()):
        return None
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in ("rank", "state", "waiting in", "at", "last collective", "stalled"):
        table.add_column(column)
    for rank, state in sorted(states.items(), key=lambda kv: int(kv[0])):
        where = state.get("where") or {}
        at = f"{where.get('file', '').rsplit('/', 1)[-1]}:{where.get('line')} ({where.get('function')})" if where else ""
        last = state.get("last_collective") or {}
        last_text = f"#{last.get('n')} {last.get('op')}" if last else ""
        stalled = f"{state['stalled_s']:.0f}s" if isinstance(state.get("stalled_s"), (int, float)) else ""
        table.add_row(str(rank), state["state"], state.get("waiting_in") or "", at, last_text, stalled)
    return table


def _timeline_table(timeline: dict, divergence: Optional[int]) -> Optional[Table]:
    """The last collectives of every rank side by side; the first divergent one marked."""
    if not isinstance(timeline, dict):
        return None
    numbers = sorted({int(n) for calls in timeline.values() for n in calls})
    if not numbers:
        return None
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", title="last collectives",
                  title_justify="left")
    table.add_column("rank")
    for n in numbers:
        table.add_column(f"#{n}" + (" <- diverge" if n == divergence else ""))
    for rank, calls in sorted(timeline.items(), key=lambda kv: int(kv[0])):
        table.add_row(rank, *[calls.get(str(n), "-") for n in numbers])
    return table


def launch_line(launch: dict) -> Optional[str]:
    """How the ranks were launched, when someone else launched them: the launcher, the Slurm job."""
    scheduler = launch.get("scheduler") or {}
    detected = launch.get("detected")
    if not detected and not scheduler:
        return None
    parts = []
    if scheduler.get("name") == "slurm":
        nodes = scheduler.get("nodes") or []
        parts.append(f"Slurm job {scheduler.get('job_id')}" + (f", step {scheduler['step_id']}"
                                                               if scheduler.get("step_id") is not None else "")
                     + (f", {scheduler['num_tasks']} task(s)" if scheduler.get("num_tasks") else "")
                     + (f" on {', '.join(nodes[:8])}{' ...' if len(nodes) > 8 else ''}" if nodes else ""))
    how = {"slurm": "a task of the srun step is a rank (" + ", ".join(launch.get("exported") or []) + " set from SLURM_*)",
           "torchrun": "inside torchrun", "environment": "inside a launch that set RANK and WORLD_SIZE"}.get(detected or "")
    if how:
        parts.append(how)
    return "launch: " + "; ".join(parts)


def _nodes_table(ranks: list[dict]) -> Table:
    """One row per node: its host and its ranks (local ranks in brackets)."""
    nodes: dict = {}
    for rank in ranks:
        nodes.setdefault((rank.get("node"), rank.get("host")), []).append(rank)
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in ("node", "host", "ranks (local rank)"):
        table.add_column(column)
    for (node, host), members in sorted(nodes.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1] or "")):
        table.add_row("-" if node is None else str(node), host or "?",
                      ", ".join(f"{r['rank']} ({r.get('local_rank')})" for r in sorted(members, key=lambda r: r["rank"])))
    return table


def _where(location: dict | None) -> str | None:
    return f"{location['file']}:{location['line']}" if location else None


def render(console: Console, report: Report, *, plain: bool, fail_on: str = "warning") -> None:
    data = report.to_json()
    console.print()
    console.print(Text(f"ddpdoctor {data['version']}: {data['script'] or 'reference job'} on "
                       f"{data['world_size']} ranks ({data['nnodes']} node{'s' if data['nnodes'] != 1 else ''}, "
                       f"{data['backend']}, {data['device']}), outcome {data['outcome']}, "
                       f"{data['duration_s']:.1f}s", style="bold"))
    simulation = device_simulation_line(report.device_simulation)
    if simulation:
        console.print(Text(simulation))
    launched = launch_line(data.get("launch") or {})
    if launched:
        console.print(Text(launched))
    hosts = {r.get("host") for r in data.get("ranks", [])}
    if data["nnodes"] > 1 or len(hosts) > 1:
        console.print(Padding(_nodes_table(data.get("ranks", [])), (0, 0, 0, 1), expand=False))
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
    if data.get("collective_benchmark"):  # the reference job's smoke test
        from ddpdoctor.analysis.render.benchmark import render_benchmark

        render_benchmark(console, data["collective_benchmark"], plain=plain)
    if data.get("cut"):
        cut = data["cut"]
        unit = "optimizer steps" if cut["reason"] == "max-steps" else "training epochs"
        console.print(Text(f"run cut on purpose after {cut['at']} {unit} (--{cut['reason']}): the checks judged "
                           "what ran until then"))
    if data.get("interruption"):
        _render_interruption(console, data["interruption"])
    for finding in data["findings"]:
        _render_finding(console, finding, plain=plain)
    for entry in data.get("suppressed", []):
        finding, where = entry["finding"], _where(entry["finding"].get("location"))
        console.print(Text(f"suppressed {finding['severity']} {finding['check']} at {where}: {finding['message']} "
                           f"(reason: {entry['reason'] or 'none given'})", style="dim"))
    for stale in data.get("unused_suppressions", []):
        console.print(Text(f"ddpdoctor: the suppression at {stale['file']}:{stale['line']} "
                           f"(ignore[{', '.join(stale['checks'])}]) matched nothing", style="yellow"))
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
    evidence = finding.get("evidence", {})
    body.extend(Text(line, style="dim") for line in _evidence_lines(evidence))
    for table in (_rank_table(evidence.get("ranks")),
                  _timeline_table(evidence.get("timeline") or {}, evidence.get("first_divergence"))):
        if table is not None:
            body.append(table)
    for consequence in finding.get("consequences", []):
        at = _where(consequence.get("location"))
        body.append(Text(f"consequence ({consequence['check']}): {consequence['message']}"
                         + (f" at {at}" if at else ""), style="" if plain else "magenta"))
    body.append(Text("fix: " + finding["fix"], style="" if plain else "green"))
    title = f"{finding['severity'].upper()} {finding['check']}"
    if plain:
        console.print(Text(title))
        for line in body:
            if isinstance(line, Text):
                console.print(Text("    ") + line)
            else:
                console.print(Padding(line, (0, 0, 0, 4), expand=False))
    else:
        console.print(Panel(Group(*body), title=title, title_align="left",
                            border_style=_SEVERITY_STYLE[finding["severity"]]))


render_finding = _render_finding  # public: `ddpdoctor env` shows its findings the same way


def _render_interruption(console: Console, interruption: dict) -> None:
    """Which signal stopped the run, what the checks did not judge, where each rank was."""
    who = f" (sent to rank {interruption['rank']})" if interruption.get("rank") is not None else ""
    if interruption.get("during") == "start-up":
        console.print(Text(f"interrupted by {interruption.get('signal')}{who} during start-up, before any rank "
                           "ran the script: nothing to check", style="bold"))
        return
    left = interruption.get("left_out_summary")
    console.print(Text(f"interrupted by {interruption.get('signal')}{who}: the checks judged what every rank completed "
                       "before it" + (f" (left out: {left})" if left else ""), style="bold"))
    table = _rank_table(interruption.get("ranks") or {})
    if table is not None:
        table.title, table.title_justify = "where each rank was", "left"
        console.print(Padding(table, (0, 0, 0, 4), expand=False))


def verdict(report: Report, fail_on: str = "warning") -> str:
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in ("error", "warning", "info")}
    tally = f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"
    if report.outcome == "interrupted":
        signal = (report.interruption or {}).get("signal") or "a signal"
        if (report.interruption or {}).get("during") == "start-up":
            return f"verdict: INTERRUPTED by {signal} during start-up: nothing was checked"
        return f"verdict: INTERRUPTED by {signal}: {tally} in what ran before it"
    if report.exit_code(fail_on):
        return f"verdict: NOT OK: {tally}"
    if counts["error"] or counts["warning"]:
        return f"verdict: OK at --fail-on {fail_on}: {tally}"
    suffix = f" ({counts['info']} info)" if counts["info"] else ""
    return f"verdict: OK: every check passed or had nothing to check{suffix}"
