"""The report in a terminal, flutter-doctor style: one line per check, then each finding as a
sentence over the user's own source line (as ruff and rustc show it), its evidence in words, the
ranks side by side where they disagree, its consequences under it, the fix, and a one-line verdict.
Plain lines, same content, when colour is off.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis.render.evidence import call_text, evidence_rows, evidence_views, ranks_text
from ddpdoctor.analysis.render.source import Snippet, Sources, display_path, snippet, underline
from ddpdoctor.analysis.render.words import (consequence_of, device_simulation_line, duration_text, parallelism_line,
                                             stop_words,
                                             verdict)
from ddpdoctor.analysis.report import CheckStatus, Report
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, Consequence, EvidenceRecord, Finding, Location

_GLYPHS = {"pass": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red"), "skip": ("-", "dim"),
           "consequence": ("↳", "magenta")}
_PLAIN = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP", "consequence": "CONSEQUENCE"}
_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
_SEVERITY_GLYPH = {"error": "✗", "warning": "!", "info": "i"}
SIDE_BY_SIDE_GROUPS = 3  # more groups of ranks than this are listed one under the other


def _location_text(location: Location, function: Optional[str] = None) -> str:
    where = f"{display_path(location.file)}:{location.line}"
    return where + (f" in {function}" if function else "")


def code_block(found: Snippet, *, plain: bool, indent: str = "") -> Text:
    """``--> file:line``, then the numbered lines with the flagged one underlined (rustc's layout)."""
    gutter = len(str(found.line))
    out = Text()
    out.append(f"{indent}{' ' * gutter}--> ", style="" if plain else "blue")
    out.append(_location_text(Location(file=found.file, line=found.line), found.function) + "\n")
    out.append(f"{indent}{' ' * gutter} |\n", style="" if plain else "blue")
    for number, text in found.lines:
        flagged = number == found.line
        out.append(f"{indent}{number:>{gutter}} | ", style="" if plain else "blue")
        out.append(text + "\n", style="" if plain or flagged else "dim")
    start, end = underline(found.text)
    out.append(f"{indent}{' ' * gutter} | ", style="" if plain else "blue")
    out.append(" " * start + "^" * (end - start), style="" if plain else "bold red")
    return out


def _code_or_where(location: Optional[Location], sources: Sources, *, plain: bool, function: Optional[str] = None,
                   indent: str = "") -> Optional[Text]:
    if not location or not location.file:
        return None
    found = snippet(location.file, location.line, sources=sources, function=function)
    if found is None:  # the file is not on this machine and the report did not keep the line
        return Text(f"{indent}--> {_location_text(location, function)}")
    return code_block(found, plain=plain, indent=indent)


def _site_code(site: Any, sources: Sources, *, plain: bool) -> Optional[Text]:
    """The code at a call site of the evidence ({file, line, function}), or None."""
    location = Location.from_site(site)
    if location is None:
        return None
    return _code_or_where(location, sources, plain=plain, function=site.get("function"))


def _evidence_table(evidence: EvidenceRecord) -> Optional[Table]:
    rows = evidence_rows(evidence)
    if not rows:
        return None
    table = Table(box=None, padding=(0, 1), show_header=False, show_edge=False)
    table.add_column("what", style="dim", no_wrap=True)
    table.add_column("value", overflow="fold")
    for label, lines in rows:
        table.add_row(label, "\n".join(lines))
    return table


def _rank_cell(ranks: list[int], state: Mapping[str, Any], sources: Sources, *, plain: bool) -> Text:
    """One group of ranks in a hang: what they wait in and for how long, their code line, their last
    collective."""
    what = state.get("state", "")
    if state.get("waiting_in"):
        what += f" in {state['waiting_in']}"
    cell = Text(f"{ranks_text(ranks)}: ", style="bold")
    cell.append(what + "\n")
    facts = []
    stalled = state.get("stalled_s")
    if isinstance(stalled, (int, float)) and stalled >= 1:
        facts.append(f"no progress for {stalled:.0f} s")
    last = state.get("last_collective") or {}
    facts.append(f"last collective #{last['n']} {last.get('op', '')}".strip() if last.get("n")
                 else "no collective yet")
    cell.append(" · ".join(facts) + "\n", style="dim")
    code = _site_code(state.get("where"), sources, plain=plain)
    if code is not None:
        cell.append_text(code)
    return cell


def _side_by_side(cells: list[Text], width: int) -> RenderableType:
    """Columns when every line of every cell fits its column (code never wraps), else one under another."""
    column = (width - 3 * (len(cells) - 1)) // max(len(cells), 1)
    fits = all(len(line) <= column for cell in cells for line in cell.plain.split("\n"))
    if 1 < len(cells) <= SIDE_BY_SIDE_GROUPS and fits:
        table = Table(box=None, padding=(0, 3, 0, 0), show_header=False, show_edge=False)
        for _ in cells:
            table.add_column(overflow="fold")
        table.add_row(*cells)
        return table
    return Group(*[Padding(c, (0, 0, 1 if i < len(cells) - 1 else 0, 0)) for i, c in enumerate(cells)])


def _ranks_view(states: Optional[Mapping[str, Any]], sources: Sources, *, plain: bool, width: int,
                when: str = "when the job was stopped") -> Optional[RenderableType]:
    """Every rank's place when the job stopped, ranks in the same place and state grouped, side by side."""
    if not isinstance(states, dict) or not states or not all(isinstance(s, dict) and "state" in s
                                                             for s in states.values()):
        return None
    groups: dict[tuple[Any, ...], list[int]] = {}
    first: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for rank, state in sorted(states.items(), key=lambda kv: int(kv[0])):
        where = state.get("where") or {}
        last = state.get("last_collective") or {}
        key = (state.get("state"), state.get("waiting_in"), where.get("file"), where.get("line"), last.get("n"))
        groups.setdefault(key, []).append(int(rank))
        first.setdefault(key, state)
    cells = [_rank_cell(ranks, first[key], sources, plain=plain) for key, ranks in groups.items()]
    return Group(Text(f"where each rank was {when}:", style="bold"), _side_by_side(cells, width))


def _calls_view(calls: Optional[Mapping[str, Any]], sources: Sources, *, plain: bool,
                width: int) -> Optional[RenderableType]:
    """A collective the ranks called differently: each rank's call and its line, side by side."""
    if not isinstance(calls, dict) or not calls or not all(isinstance(c, dict) for c in calls.values()):
        return None
    cells = []
    for rank, call in sorted(calls.items(), key=lambda kv: int(kv[0])):
        cell = Text(f"rank {rank}: ", style="bold")
        cell.append(call_text(call) + "\n")
        site = call.get("site")
        code = _site_code(site[0] if isinstance(site, list) and site else site, sources, plain=plain)
        if code is not None:
            cell.append_text(code)
        cells.append(cell)
    return Group(Text("each rank's call:", style="bold"), _side_by_side(cells, width))


def _timeline_table(timeline: Optional[Mapping[str, Any]], divergence: Optional[int]) -> Optional[Table]:
    """The last collectives of every rank side by side; the first divergent one marked."""
    if not isinstance(timeline, dict) or not all(isinstance(c, dict) for c in timeline.values()):
        return None
    numbers = sorted({int(n) for calls in timeline.values() for n in calls})
    if not numbers:
        return None
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", title="last collectives",
                  title_justify="left")
    ranks = sorted(timeline.items(), key=lambda kv: int(kv[0]))
    if len(ranks) <= 4:  # one row per collective, the ranks side by side
        table.add_column("#")
        for rank, _ in ranks:
            table.add_column(f"rank {rank}")
        for n in numbers:
            table.add_row(f"#{n}" + (" ← first divergence" if n == divergence else ""),
                          *[calls.get(str(n), "never called") for _, calls in ranks])
        return table
    table.add_column("ranks")
    for n in numbers:
        table.add_column(f"#{n}" + (" ← first divergence" if n == divergence else ""))
    rows: dict[tuple[str, ...], list[int]] = {}  # ranks with the same calls share a row: a thousand ranks fit a screen
    for rank, calls in ranks:
        rows.setdefault(tuple(calls.get(str(n), "never called") for n in numbers), []).append(int(rank))
    for cells, members in rows.items():
        table.add_row(ranks_text(members), *cells)
    return table


def _consequence(consequence: Consequence, *, plain: bool) -> Text:
    glyph, style = _GLYPHS["consequence"]
    line = Text(f"{glyph} " if not plain else "-> ", style="" if plain else f"bold {style}")
    line.append(f"consequence ({consequence.check}): ", style="" if plain else style)
    line.append(consequence.message)
    if consequence.location:
        line.append(f" at {_location_text(consequence.location)}", style="dim")
    return line


def finding_body(finding: Finding, *, sources: Sources, plain: bool, width: int,
                 when: str = "when the job was stopped") -> list[RenderableType]:
    """The parts of one finding, top to bottom: sentence, code, ranks, evidence, consequences, fix."""
    body: list[RenderableType] = [Text(finding.message)]
    code = _code_or_where(finding.location, sources, plain=plain)
    if code is not None:
        body.append(code)
    if finding.ranks:
        body.append(Text(f"on {ranks_text(finding.ranks)}", style="dim"))
    views = evidence_views(finding.evidence)
    for view in (_ranks_view(views.states, sources, plain=plain, width=width, when=views.states_when(when)),
                 _calls_view(views.calls, sources, plain=plain, width=width),
                 _timeline_table(views.timeline, views.divergence)):
        if view is not None:
            body.append(view)
    table = _evidence_table(finding.evidence)
    if table is not None:
        body.append(table)
    body.extend(_consequence(c, plain=plain) for c in finding.consequences)
    fix = Text("fix: ", style="" if plain else "bold green")
    fix.append(finding.fix, style="" if plain else "green")
    body.append(fix)
    return body


def _render_finding(console: Console, finding: Finding, *, plain: bool, sources: Optional[Sources] = None,
                    when: str = "when the job was stopped") -> None:
    width = max(60, console.width - 8)
    body = finding_body(finding, sources=sources or {}, plain=plain, width=width, when=when)
    severity = finding.severity.value
    title = f"{severity.upper()} {finding.check}"
    if plain:  # CI logs: sentences never cut (the log wraps them), tables and columns fit the width
        console.print(Text(title))
        for part in body:
            if isinstance(part, Text):
                for line in part.split("\n"):
                    console.print(Text("    ") + line, soft_wrap=True)
            else:  # tables and columns laid out to the width, without rich's trailing padding
                options = console.options.update(width=max(40, console.width - 4))
                for segments in console.render_lines(part, options, pad=False):
                    text = "".join(segment.text for segment in segments).rstrip()
                    console.print(Text("    " + text if text else ""), soft_wrap=True)
        return
    spaced: list[RenderableType] = []
    for part in body:
        spaced.append(part)
        if isinstance(part, (Group, Table)) or (isinstance(part, Text) and "-->" in part.plain):
            spaced.append(Text(""))
    console.print(Panel(Group(*spaced), title=f"{_SEVERITY_GLYPH[severity]} {title}", title_align="left",
                        border_style=_SEVERITY_STYLE[severity]))


render_finding = _render_finding  # public: `ddpdoctor env` shows its findings the same way


def _status_and_summary(check: CheckStatus, findings: Sequence[Finding]) -> tuple[str, str]:
    status = "consequence" if consequence_of(check, findings) else check.status
    summary = check.summary + (f" [incomplete: probe {', '.join(check.incomplete)} failed]"
                               if check.incomplete else "")
    return status, summary


def _check_line(check: CheckStatus, findings: Sequence[Finding], *, plain: bool, width: int) -> Text:
    status, summary = _status_and_summary(check, findings)
    if plain:
        return Text(f"[{_PLAIN[status]}] {check.id}: {summary}")
    glyph, id_text, summary_text = _check_cells(check, findings)
    return Text(" ") + glyph + Text(" ") + Text(f"{check.id:<{width}}", style="bold") + summary_text


def _check_cells(check: CheckStatus, findings: Sequence[Finding]) -> tuple[Text, Text, Text]:
    status, summary = _status_and_summary(check, findings)
    glyph, style = _GLYPHS[status]
    return (Text(glyph, style=f"bold {style}"), Text(check.id, style="bold"),
            Text(summary, style="dim" if status in ("pass", "skip") else style if status == "consequence" else ""))


def launch_line(launch: Mapping[str, Any]) -> Optional[str]:
    """How the ranks were launched, when someone else launched them: the launcher, the Slurm job."""
    scheduler = launch.get("scheduler") or {}
    detected = launch.get("detected")
    if not detected and not scheduler:
        return None
    parts = []
    if scheduler.get("name") == "slurm":
        nodes = scheduler.get("nodes") or []
        parts.append(f"Slurm job {scheduler.get('job_id')}"
                     + (f", step {scheduler['step_id']}" if scheduler.get("step_id") is not None else "")
                     + (f", {scheduler['num_tasks']} task(s)" if scheduler.get("num_tasks") else "")
                     + (f" on {', '.join(nodes[:8])}{' ...' if len(nodes) > 8 else ''}" if nodes else ""))
    how = {"slurm": ("a task of the srun step is a rank ("
                     + ", ".join(launch.get("exported") or []) + " set from SLURM_*)"),
           "torchrun": "inside torchrun",
           "environment": "inside a launch that set RANK and WORLD_SIZE"}.get(detected or "")
    if how:
        parts.append(how)
    return "launch: " + "; ".join(parts)


def _nodes_table(ranks: Sequence[Mapping[str, Any]]) -> Table:
    """One row per node: its host and its ranks (local ranks in brackets)."""
    nodes: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for rank in ranks:
        nodes.setdefault((rank.get("node"), rank.get("host")), []).append(rank)
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in ("node", "host", "ranks (local rank)"):
        table.add_column(column)
    for (node, host), members in sorted(nodes.items(),
                                        key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1] or "")):
        table.add_row("-" if node is None else str(node), host or "?",
                      ", ".join(f"{r['rank']} ({r.get('local_rank')})"
                                for r in sorted(members, key=lambda r: r["rank"])))
    return table


def _render_interruption(console: Console, interruption: Mapping[str, Any], sources: Sources, *,
                         plain: bool) -> None:
    """Which signal stopped the run, what the checks did not judge, where each rank was."""
    who = f" (sent to rank {interruption['rank']})" if interruption.get("rank") is not None else ""
    if interruption.get("during") == "start-up":
        console.print(Text(f"interrupted by {interruption.get('signal')}{who} during start-up, before any rank "
                           "ran the script: nothing to check", style="bold"))
        return
    left = interruption.get("left_out_summary")
    console.print(Text(f"interrupted by {interruption.get('signal')}{who}: the checks judged what every rank completed "
                       "before it" + (f" (left out: {left})" if left else ""), style="bold"))
    view = _ranks_view(interruption.get("ranks") or {}, sources, plain=plain, width=max(60, console.width - 8))
    if view is not None:
        console.print(Padding(view, (0, 0, 0, 4), expand=False))


def render(console: Console, report: Report, *, plain: bool, fail_on: str = DEFAULT_FAIL_ON) -> None:
    post_mortem = bool(report.post_mortem)
    console.print()
    nodes = f"{report.nnodes} node{'s' if report.nnodes != 1 else ''}"
    script = display_path(report.script) if report.script else "reference job"
    duration = duration_text(round(report.duration_s, 3), post_mortem=post_mortem)  # as the JSON report has it
    console.print(Text(f"ddpdoctor {report.version}: {script} on "
                       f"{report.world_size} ranks ({nodes}, {report.backend}, {report.device}), outcome "
                       f"{report.outcome}, {duration}", style="bold"))
    if report.framework:
        framework = report.framework
        console.print(Text(f"framework: {framework['title']} {framework.get('version') or ''}".rstrip()
                           + " (DDP set up by it; fixes use its words)"))
    for line in (parallelism_line(report.parallelism), device_simulation_line(report.device_simulation)):
        if line:
            console.print(Text(line))
    launched = launch_line(report.launch or {})
    if launched:
        console.print(Text(launched))
    if report.nnodes > 1 or len({r.get("host") for r in report.ranks}) > 1:
        console.print(Padding(_nodes_table(report.ranks), (0, 0, 0, 1), expand=False))
    if plain:
        for check in report.checks:
            console.print(_check_line(check, report.findings, plain=True, width=0))
    elif report.checks:  # a grid: a long summary wraps under itself, never under the glyphs
        grid = Table(box=None, padding=(0, 1), show_header=False, show_edge=False)
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for check in report.checks:
            glyph, id_text, summary = _check_cells(check, report.findings)
            grid.add_row(glyph, id_text, summary)
        console.print(grid)
    if report.collective_benchmark:  # the reference job's smoke test
        from ddpdoctor.analysis.render.benchmark import render_benchmark

        render_benchmark(console, report.collective_benchmark, plain=plain)
    if report.cut:
        cut = report.cut
        unit = "optimizer steps" if cut["reason"] == "max-steps" else "training epochs"
        console.print(Text(f"run cut on purpose after {cut['at']} {unit} (--{cut['reason']}): the checks judged "
                           "what ran until then"))
    sources = report.sources or {}
    if report.interruption:
        _render_interruption(console, report.interruption, sources, plain=plain)
    for finding in report.findings:
        _render_finding(console, finding, plain=plain, sources=sources, when=stop_words(post_mortem))
    for entry in report.suppressed:
        hidden = Finding.from_json(entry["finding"])
        where = f" at {_location_text(hidden.location)}" if hidden.location else ""
        console.print(Text(f"suppressed {hidden.severity} {hidden.check}{where}: {hidden.message} "
                           f"(reason: {entry['reason'] or 'none given'})", style="dim"))
    for stale in report.unused_suppressions:
        console.print(Text(f"ddpdoctor: the suppression at {stale['file']}:{stale['line']} "
                           f"(ignore[{', '.join(stale['checks'])}]) matched nothing", style="yellow"))
    for problem in report.probe_errors:
        left = (f"checks left incomplete: {', '.join(problem['checks'])}" if problem["checks"]
                else "no check left incomplete")
        # A probe of the analysis (a post-mortem's missing dump) failed on no rank: no "on ..." then.
        where = f" on {ranks_text(problem['ranks'])}" if problem["ranks"] else ""
        console.print(Text(f"ddpdoctor: probe {problem['probe']} failed ({problem['error']}){where}; {left}",
                           style="yellow"))
    if report.launcher_log:
        count = len(report.launcher_log)
        where = f" in {report.launcher_log_path}" if report.launcher_log_path else " in the JSON report (launcher_log)"
        console.print(Text(f"torchrun's own log ({count} line{'s' if count != 1 else ''}) is{where}", style="dim"))
    console.print(Text(verdict(report, fail_on), style="bold"))


__all__ = ["render", "render_finding", "finding_body", "code_block"]
