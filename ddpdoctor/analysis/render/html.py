"""``--html PATH``: the report as one self-contained page that reads without the terminal.

The verdict, every finding with the user's code line, the ranks side by side where they disagree,
a per-rank timeline picture, step time per rank, the smoke test's bandwidth plot, the environment
and the suppressed findings. Everything is inline (CSS, SVG from :mod:`.svg`); the page fetches
nothing, so it opens offline from disk, from a CI artifact or an e-mail attachment.
"""

from __future__ import annotations

import datetime
from html import escape
from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.analysis.render import svg
from ddpdoctor.analysis.render.evidence import call_text, evidence_rows, evidence_views, ranks_text
from ddpdoctor.analysis.render.source import Sources, display_path, snippet, underline
from ddpdoctor.analysis.render.words import (consequence_of, device_simulation_line, duration_text, parallelism_line,
                                             stop_words,
                                             verdict)
from ddpdoctor.analysis.report import CheckStatus, Report
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, EvidenceRecord, Finding, Location

__all__ = ["render_html"]

_STATUS = {"pass": ("✓", "pass"), "warn": ("!", "warn"), "fail": ("✗", "fail"), "skip": ("–", "skip"),
           "consequence": ("↳", "cons")}

CSS = """
:root { --red:#b91c1c; --green:#15803d; --yellow:#a16207; --blue:#1d4ed8; --muted:#6b7280; --line:#e5e7eb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #111827;
       background: #f9fafb; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 48px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 10px; }
.verdict { padding: 14px 18px; border-radius: 8px; color: #fff; margin-bottom: 16px; }
.verdict.bad { background: var(--red); } .verdict.good { background: var(--green); }
.verdict .meta { opacity: .9; font-size: 13px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
td, th { text-align: left; padding: 4px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: #374151; }
.checks td.glyph { width: 24px; font-weight: 700; text-align: center; }
.pass { color: var(--green); } .fail { color: var(--red); } .warn { color: var(--yellow); }
.skip { color: var(--muted); } .cons { color: #7e22ce; }
.finding { background: #fff; border: 1px solid var(--line); border-left: 5px solid var(--red); border-radius: 6px;
           padding: 12px 16px; margin: 12px 0; }
.finding.warning { border-left-color: #ca8a04; } .finding.info { border-left-color: #0891b2; }
.finding h3 { margin: 0 0 6px; font-size: 15px; }
.sev { font-size: 12px; font-weight: 700; padding: 1px 6px; border-radius: 4px; color: #fff; background: var(--red);
       margin-right: 6px; }
.sev.warning { background: #ca8a04; } .sev.info { background: #0891b2; }
.message { margin: 6px 0 10px; }
pre.code { background: #0f172a; color: #e2e8f0; padding: 8px 12px; border-radius: 6px; overflow-x: auto;
           font: 12.5px/1.5 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; margin: 6px 0; }
pre.code .where { color: #93c5fd; } pre.code .ln { color: #64748b; user-select: none; }
pre.code .ctx { color: #94a3b8; } pre.code .hit { color: #fff; } pre.code .caret { color: #f87171; font-weight: 700; }
.ranks { display: grid; gap: 10px; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr)); margin: 8px 0; }
.rankcell { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; background: #fcfcfd; }
.rankcell .who { font-weight: 600; } .muted { color: var(--muted); }
.evidence td:first-child { color: var(--muted); width: 260px; white-space: nowrap; }
.consequence { color: #6b21a8; margin: 4px 0; } .fix { color: var(--green); margin-top: 8px; }
.fix b { color: #14532d; }
svg { background: #fff; border: 1px solid var(--line); border-radius: 6px; display: block; }
svg text { font: 11px system-ui, sans-serif; fill: #374151; }
svg .rank { font-weight: 600; } svg .axis { fill: #6b7280; } svg .legend { fill: #111827; }
svg .grid { stroke: #f1f5f9; } svg .axisline { stroke: #9ca3af; }
svg .alive { fill: #eef2ff; } svg .step { stroke: #93c5fd; stroke-width: 1; }
svg .coll { stroke: #f59e0b; stroke-width: 1.5; } svg .coll.diverge { stroke: #dc2626; stroke-width: 3; }
svg .clabel { fill: #b45309; font-size: 10px; } svg .clabel.diverge { fill: #dc2626; font-weight: 700; }
svg .save { fill: #7c3aed; fill-opacity: .55; }
svg .missing { stroke: #dc2626; stroke-width: 2; stroke-dasharray: 3 2; }
svg .stall { fill: #dc2626; fill-opacity: .16; stroke: #dc2626; stroke-opacity: .5; stroke-dasharray: 3 2; }
svg .end { font-size: 15px; font-weight: 700; } svg .end.crash { fill: #dc2626; } svg .end.exit { fill: #16a34a; }
svg .end.stopped { fill: #7c3aed; } svg .stopline { stroke: #7c3aed; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg .stoplabel { fill: #7c3aed; font-weight: 600; }
svg .band { fill: #f3f4f6; stroke: #d1d5db; stroke-dasharray: 4 3; } svg .band.idle { fill: #fef2f2; }
svg .bandlabel { fill: #374151; font-weight: 600; } svg .bandstep { fill: #6b7280; font-size: 10.5px; }
svg .axisbreak { stroke: #9ca3af; stroke-width: 1.2; fill: none; }
.legendrow { font-size: 12px; color: var(--muted); margin: 4px 0 0; }
.legendrow span { margin-right: 14px; }
footer { color: var(--muted); font-size: 12px; margin-top: 32px; }
"""


def _code(location: Optional[Location], sources: Sources, *, function: Optional[str] = None) -> str:
    if not location or not location.file:
        return ""
    where = f"{display_path(location.file)}:{location.line}" + (f" in {function}" if function else "")
    found = snippet(location.file, location.line, sources=sources, function=function)
    if found is None:
        return f'<pre class="code"><span class="where">--&gt; {escape(where)}</span></pre>'
    gutter = len(str(found.line))
    lines = [f'<span class="where">{" " * gutter}--&gt; {escape(where)}</span>']
    for number, text in found.lines:
        cls = "hit" if number == found.line else "ctx"
        lines.append(f'<span class="ln">{number:>{gutter}} | </span><span class="{cls}">{escape(text)}</span>')
    start, end = underline(found.text)
    lines.append(f'<span class="ln">{" " * gutter} | </span>'
                 f'<span class="caret">{" " * start}{"^" * (end - start)}</span>')
    return '<pre class="code">' + "\n".join(lines) + "</pre>"


def _site_code(site: Any, sources: Sources) -> str:
    """The code at a call site of the evidence ({file, line, function}), or nothing."""
    location = Location.from_site(site)
    return _code(location, sources, function=site.get("function")) if location is not None else ""


def _ranks_grid(states: Optional[Mapping[str, Any]], sources: Sources, when: str) -> str:
    if not isinstance(states, dict) or not states or not all(isinstance(s, dict) and "state" in s
                                                             for s in states.values()):
        return ""
    groups: dict[tuple[Any, ...], list[int]] = {}
    first: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for rank, state in sorted(states.items(), key=lambda kv: int(kv[0])):
        where = state.get("where") or {}
        last = state.get("last_collective") or {}
        key = (state.get("state"), state.get("waiting_in"), where.get("file"), where.get("line"), last.get("n"))
        groups.setdefault(key, []).append(int(rank))
        first.setdefault(key, state)
    cells = []
    for key, ranks in groups.items():
        state = first[key]
        what = state.get("state", "") + (f" in {state['waiting_in']}" if state.get("waiting_in") else "")
        facts = []
        if isinstance(state.get("stalled_s"), (int, float)) and state["stalled_s"] >= 1:
            facts.append(f"no progress for {state['stalled_s']:.0f} s")
        last = state.get("last_collective") or {}
        facts.append(f"last collective #{last['n']} {last.get('op', '')}" if last.get("n") else "no collective yet")
        cells.append(f'<div class="rankcell"><div class="who">{escape(ranks_text(ranks))}: {escape(what)}</div>'
                     f'<div class="muted">{escape(" · ".join(facts))}</div>'
                     f'{_site_code(state.get("where"), sources)}</div>')
    return f'<div class="muted">where each rank was {escape(when)}:</div><div class="ranks">' + \
        "".join(cells) + "</div>"


def _calls_grid(calls: Optional[Mapping[str, Any]], sources: Sources) -> str:
    if not isinstance(calls, dict) or not calls or not all(isinstance(c, dict) for c in calls.values()):
        return ""
    cells = []
    for rank, call in sorted(calls.items(), key=lambda kv: int(kv[0])):
        site = call.get("site")
        site = site[0] if isinstance(site, list) and site else site
        cells.append(f'<div class="rankcell"><div class="who">rank {escape(str(rank))}: {escape(call_text(call))}</div>'
                     f'{_site_code(site, sources)}</div>')
    return '<div class="muted">each rank\'s call:</div><div class="ranks">' + "".join(cells) + "</div>"


def _evidence(evidence: EvidenceRecord) -> str:
    rows = evidence_rows(evidence)
    if not rows:
        return ""
    body = "".join(f"<tr><td>{escape(label)}</td><td>{'<br>'.join(escape(line) for line in lines)}</td></tr>"
                   for label, lines in rows)
    return f'<table class="evidence">{body}</table>'


def _finding(finding: Finding, sources: Sources, *, when: str = "when the job was stopped") -> str:
    severity = finding.severity.value
    views = evidence_views(finding.evidence)
    parts = [f'<div class="finding {escape(severity)}"><h3><span class="sev {escape(severity)}">'
             f'{escape(severity.upper())}</span>{escape(finding.check)}</h3>',
             f'<div class="message">{escape(finding.message)}</div>',
             _code(finding.location, sources)]
    if finding.ranks:
        parts.append(f'<div class="muted">on {escape(ranks_text(finding.ranks))}</div>')
    parts += [_ranks_grid(views.states, sources, views.states_when(when)), _calls_grid(views.calls, sources),
              _evidence(finding.evidence)]
    for consequence in finding.consequences:
        at = f" at {display_path(consequence.location.file)}:{consequence.location.line}" \
            if consequence.location else ""
        parts.append(f'<div class="consequence">↳ consequence ({escape(consequence.check)}): '
                     f'{escape(consequence.message)}<span class="muted">{escape(at)}</span></div>')
    parts.append(f'<div class="fix"><b>fix:</b> {escape(finding.fix)}</div></div>')
    return "".join(parts)


def _checks(checks: Sequence[CheckStatus], findings: Sequence[Finding]) -> str:
    rows = []
    for check in checks:
        status = "consequence" if consequence_of(check, findings) else check.status
        glyph, cls = _STATUS.get(status, ("?", "skip"))
        rows.append(f'<tr><td class="glyph {cls}">{glyph}</td><td><code>{escape(check.id)}</code></td>'
                    f'<td class="{cls if status != "pass" else ""}">{escape(check.summary)}</td></tr>')
    return f'<table class="checks">{"".join(rows)}</table>'


def _environment(environment: Sequence[Mapping[str, Any]]) -> str:
    if not environment:
        return ""
    columns = (("rank", "rank"), ("host", "host"), ("node", "node"), ("local", "local_rank"), ("python", "python"),
               ("torch", "torch"), ("CUDA", "cuda"), ("cuDNN", "cudnn"), ("NCCL", "nccl"), ("driver", "driver"),
               ("backend", "backend"))
    head = "".join(f"<th>{name}</th>" for name, _ in columns) + "<th>GPU</th>"
    rows = []
    for env in environment:
        device = env.get("device") or {}
        gpu = f"cuda:{device.get('index')} {device.get('name') or ''}".strip() if device else "-"
        rows.append("<tr>" + "".join(f"<td>{escape(str(env.get(key) if env.get(key) not in (None, '') else '-'))}</td>"
                                     for _, key in columns) + f"<td>{escape(gpu)}</td></tr>")
    return f"<h2>Environment</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def _suppressed(report: Report) -> str:
    items = []
    for entry in report.suppressed:
        finding = Finding.from_json(entry["finding"])
        where = f" at {display_path(finding.location.file)}:{finding.location.line}" if finding.location else ""
        items.append(f"<li><b>{escape(finding.severity.value)} {escape(finding.check)}</b>{escape(where)}: "
                     f"{escape(finding.message)} <span class=\"muted\">(reason: "
                     f"{escape(entry.get('reason') or 'none given')})</span></li>")
    for stale in report.unused_suppressions:
        items.append(f"<li>the suppression at {escape(display_path(stale['file']))}:{stale['line']} "
                     f"(ignore[{escape(', '.join(stale['checks']))}]) matched nothing</li>")
    if not items:
        return ""
    return f"<h2>Suppressed findings</h2><ul>{''.join(items)}</ul>"


def _timeline_section(timeline: Optional[Mapping[str, Any]], *, post_mortem: bool = False) -> str:
    if not timeline or not timeline.get("ranks"):
        return ""
    dropped = sum(lane.get("dropped_steps", 0) + lane.get("dropped_collectives", 0)
                  for lane in timeline["ranks"].values())
    note = (f" Long run: every rank shows at most {timeline.get('points_per_rank')} steps and collectives "
            "(evenly thinned steps, the last collectives).") if dropped else ""
    legend = ('<div class="legendrow"><span style="color:#93c5fd">| optimizer step</span>'
              '<span style="color:#f59e0b">| collective #n</span><span style="color:#dc2626">| first divergence</span>'
              '<span style="color:#7c3aed">▬ torch.save</span>'
              '<span style="color:#dc2626">▨ no progress</span><span style="color:#dc2626">✗ crashed</span>'
              '<span style="color:#16a34a">■ exited</span><span style="color:#7c3aed">■ '
              f'{"dumped (the job stopped on its own)" if post_mortem else "stopped by ddpdoctor"}</span>'
              f'</div><div class="legendrow">{escape(note)}</div>')
    parts = ["<h2>Timeline</h2>", svg.timeline_svg(timeline), legend]
    steps = svg.step_time_svg(timeline)
    if steps:
        parts += ["<h2>Step time per rank</h2>", steps]
    return "".join(parts)


def render_html(report: Report, *, fail_on: str = DEFAULT_FAIL_ON) -> str:
    sources = report.sources or {}
    post_mortem = bool(report.post_mortem)
    bad = report.exit_code(fail_on) != 0
    nodes = f"{report.nnodes} node{'s' if report.nnodes != 1 else ''}"
    script = report.script or "reference job"
    duration = duration_text(round(report.duration_s, 3), post_mortem=post_mortem, unit=" s")  # as the JSON has it
    meta = (f"{escape(display_path(script) if report.script else script)} on {report.world_size} ranks ({nodes}, "
            f"{escape(report.backend)}, {escape(report.device)}) · outcome <b>{escape(report.outcome)}</b> · "
            f"{escape(duration)} · ddpdoctor {escape(report.version)}")
    notes = [line for line in (parallelism_line(report.parallelism), device_simulation_line(report.device_simulation))
             if line]
    body = [f'<div class="verdict {"bad" if bad else "good"}"><h1>{escape(verdict(report, fail_on))}</h1>'
            f'<div class="meta">{meta}</div>'
            + "".join(f'<div class="meta">{escape(line)}</div>' for line in notes) + "</div>"]
    if report.findings:
        body.append("<h2>Findings</h2>")
        body += [_finding(f, sources, when=stop_words(post_mortem)) for f in report.findings]
    body.append(_timeline_section(report.timeline, post_mortem=post_mortem))
    body += ["<h2>Checks</h2>", _checks(report.checks, report.findings)]
    if report.collective_benchmark and report.collective_benchmark.get("rows"):
        body += ["<h2>Collective bandwidth (smoke test)</h2>", svg.bandwidth_svg(report.collective_benchmark)]
    body.append(_environment(report.environment or []))
    body.append(_suppressed(report))
    if report.launcher_log:
        body.append("<h2>torchrun's own log</h2><pre class=\"code\">" +
                    "\n".join(escape(line) for line in report.launcher_log[-50:]) + "</pre>")
    generated = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    body.append(f"<footer>ddpdoctor {escape(report.version)} · generated {generated} · "
                f"<code>ddpdoctor report REPORT.json --html PATH</code> renders a saved JSON report again</footer>")
    title = f"ddpdoctor: {script} · {verdict(report, fail_on)}"
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body><main>"
            + "\n".join(part for part in body if part) + "</main></body></html>\n")
