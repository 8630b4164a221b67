"""The HTML report's pictures, as inline SVG written here (no plotting package, nothing fetched).

- :func:`timeline_svg`: one lane per rank over the run's wall time: steps as ticks, collectives as
  numbered ticks, the first divergence marked, stalls shaded, crashes, exits and ddpdoctor's stop.
  Its axis starts where training starts; start-up (import torch, init_process_group...) is one labelled
  band of fixed width at the left, and a hang's common wait another, so neither squeezes the steps.
- :func:`step_time_svg`: seconds per optimizer step over the run, one line per rank (a straggler
  shows as the line above the others); with many ranks, the median and the slowest rank.
- :func:`bandwidth_svg`: the smoke test's bus bandwidth against message size, one line per op.

Details are in ``<title>`` elements, which browsers show on hover without any script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.analysis.render.words import format_bytes

__all__ = ["timeline_svg", "step_time_svg", "bandwidth_svg", "PALETTE", "TimeAxis"]

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
WIDTH = 1100
LABEL_W = 78
MAX_LANES_DRAWN_HIGH = 32
BAND_W = 170  # a compressed stretch of time (start-up, a hang's wait), whatever its duration
BAND_GAP = 12  # between a band and the axis to scale: where the axis breaks


def _f(x: float) -> str:
    return f"{x:.1f}"


def nice_ticks(low: float, high: float, count: int = 8) -> list[float]:
    """Round axis values (1, 2 or 5 times a power of ten) covering [low, high]."""
    span = max(high - low, 1e-9)
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-6:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _seconds_label(value: float) -> str:
    return f"{value:g} s" if value >= 1 or value == 0 else f"{value * 1000:g} ms"


def _svg(width: int, height: int, body: list[str], *, label: str, css_class: str) -> str:
    return (f'<svg class="{css_class}" viewBox="0 0 {width} {height}" width="100%" role="img" '
            f'aria-label="{escape(label)}" preserveAspectRatio="xMinYMin meet">' + "".join(body) + "</svg>")


@dataclass(frozen=True)
class Piece:
    """A stretch of wall time [t0, t1] drawn over pixels [x0, x1]; ``band`` names a compressed one."""

    t0: float
    t1: float
    x0: float
    x1: float
    band: str = ""  # "" (to scale) | "startup" | "idle"

    def x(self, t: float) -> float:
        return self.x0 + (self.x1 - self.x0) * (t - self.t0) / max(self.t1 - self.t0, 1e-9)


class TimeAxis:
    """Wall time (seconds since the first rank started) to x, in pieces, so the width goes where
    steps and collectives are: start-up (0 to training) is a band of ``BAND_W`` pixels at the left, a
    stretch where every rank made no progress (a hang) another band when it would take over half of
    the axis, and the rest of training is to scale. Without training, [0, end] is to scale."""

    def __init__(self, timeline: Mapping[str, Any], *, left: float, right: float) -> None:
        startup = timeline.get("startup") or {}
        self.start = max(0.0, float(startup.get("end") or 0.0))
        self.end = max(float(timeline.get("end") or 0.0), self.start + 1e-3)
        self.pieces: list[Piece] = []
        x = left
        if self.start > 0:
            self.pieces.append(Piece(0.0, self.start, x, x + BAND_W, "startup"))
            x += BAND_W + BAND_GAP
        idle = common_stall(timeline, self.start, self.end)
        if idle is None:
            self.pieces.append(Piece(self.start, self.end, x, right))
            return
        a, b = idle
        to_scale = (a - self.start) + (self.end - b)
        width = right - x - BAND_W - 2 * BAND_GAP
        before = width * (a - self.start) / to_scale if to_scale > 0 else width
        self.pieces.append(Piece(self.start, a, x, x + before))
        x += before + BAND_GAP
        self.pieces.append(Piece(a, b, x, x + BAND_W, "idle"))
        if self.end > b:
            self.pieces.append(Piece(b, self.end, x + BAND_W + BAND_GAP, right))

    def __call__(self, t: Optional[float]) -> float:
        value = max(0.0, min(float(t or 0.0), self.end))
        piece = next((p for p in self.pieces if value < p.t1), self.pieces[-1])  # a piece's start is its own
        return piece.x(max(value, piece.t0))

    def band(self, name: str) -> Optional[Piece]:
        return next((p for p in self.pieces if p.band == name), None)

    def ticks(self) -> list[float]:
        """Round seconds inside the pieces drawn to scale, at one spacing for all of them."""
        scaled = [p for p in self.pieces if not p.band and p.x1 - p.x0 >= 60]
        if not scaled:
            return []
        span = sum(p.t1 - p.t0 for p in scaled)
        count = max(2, round(8 * sum(p.x1 - p.x0 for p in scaled) / max(self.pieces[-1].x1 - self.pieces[0].x0, 1)))
        spacing = nice_ticks(0.0, span, count)
        step = spacing[1] - spacing[0] if len(spacing) > 1 else span
        return [t for p in scaled for t in _multiples(p.t0, p.t1, step)]


def _multiples(low: float, high: float, step: float) -> list[float]:
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def common_stall(timeline: Mapping[str, Any], start: float, end: float) -> Optional[tuple[float, float]]:
    """The stretch where no rank did anything, in a run whose every rank was seen stalled: from the
    last step, collective or save of any rank to the end of the earliest rank's last stall, when it
    would take over half of the training axis drawn to scale; None otherwise."""
    lanes = list((timeline.get("ranks") or {}).values())
    stalls = [lane["stalls"][-1] for lane in lanes if lane.get("stalls")]
    if not lanes or len(stalls) < len(lanes):
        return None
    activity = [start] + [float(p[0]) for lane in lanes for key in ("steps", "collectives")
                          for p in lane.get(key) or []]
    activity += [float(t) + float(d) for lane in lanes for t, d, *_ in lane.get("saves") or []]
    last, b = max(activity), min(float(s[1]) for s in stalls)
    a = min(b, last + 0.25 * (last - start))  # room after the last tick for its label
    if b - a <= 0.5 * (end - start):
        return None
    return a, b


def _band_words(piece: Piece, lines: list[tuple[str, str]], title: str, *, top: float, lanes_h: float) -> list[str]:
    """A band's words over the lanes, as many lines as fit (the first says what the band is)."""
    fit = max(1, int((lanes_h - 2) // 13))
    if len(lines) > fit:
        lines = lines[:1] if fit == 1 else lines[:fit - 1] + [("…", "bandstep")]
    out = []
    y = top + max(11.0, (lanes_h - 13 * len(lines)) / 2 + 9)
    for text, cls in lines:
        out.append(f'<text class="{cls}" x="{_f(piece.x0 + 8)}" y="{_f(y)}">{escape(text)}<title>{escape(title)}'
                   "</title></text>")
        y += 13
    return out


def _band_under(piece: Piece, title: str, *, top: float, lanes_h: float) -> list[str]:
    """A band's background and the axis break after it (and before it, for a band inside the axis)."""
    out = [f'<rect class="band {piece.band}" x="{_f(piece.x0)}" y="{top - 4}" width="{_f(piece.x1 - piece.x0)}" '
           f'height="{_f(lanes_h + 4)}"><title>{escape(title)}</title></rect>']
    y = top + lanes_h + 8
    for gap in ([piece.x0 - BAND_GAP / 2] if piece.band != "startup" else []) + [piece.x1 + BAND_GAP / 2]:
        out.append(f'<path class="axisbreak" d="M{_f(gap - 4)} {_f(y)} l4 -8 M{_f(gap)} {_f(y)} l4 -8"/>')
    return out


def _startup_phases(timeline: Mapping[str, Any], start: float) -> list[tuple[str, float]]:
    """(what, seconds) from one milestone to the next (the first rank to get there), then the rest of
    the set-up until training: they add up to the start-up."""
    phases, previous = [], 0.0
    for what, t in (timeline.get("startup") or {}).get("milestones") or []:
        phases.append((str(what), max(0.0, float(t) - previous)))
        previous = float(t)
    if phases and start > previous:
        phases.append(("rest of set-up", start - previous))
    return phases


def _bands(timeline: Mapping[str, Any], axis: TimeAxis, *, top: float, lanes_h: float) -> tuple[list[str], list[str]]:
    """The compressed bands: (what goes under the lanes, their words that go over them)."""
    under: list[str] = []
    over: list[str] = []
    startup = axis.band("startup")
    if startup is not None:
        phases = _startup_phases(timeline, axis.start)
        title = (f"start-up {_duration(axis.start)}, from the first rank's start to the first sign of training "
                 "(a DDP forward, an optimizer step or a collective), drawn compressed"
                 + "".join(f"; {what} {_duration(d)}" for what, d in phases))
        under += _band_under(startup, title, top=top, lanes_h=lanes_h)
        under.append(f'<text class="axis" x="{_f(startup.x0)}" y="{_f(top + lanes_h + 16)}">0 s</text>')
        over += _band_words(startup, [(f"start-up {_duration(axis.start)}", "bandlabel"),
                                      *((f"{what} {_duration(d)}", "bandstep") for what, d in phases)],
                            title, top=top, lanes_h=lanes_h)
    idle = axis.band("idle")
    if idle is not None:
        title = (f"no rank made progress from {idle.t0:.1f} s to {idle.t1:.1f} s ({_duration(idle.t1 - idle.t0)}), "
                 "drawn compressed")
        under += _band_under(idle, title, top=top, lanes_h=lanes_h)
        over += _band_words(idle, [(f"no progress {_duration(idle.t1 - idle.t0)}", "bandlabel"),
                                   (f"{idle.t0:.1f} s to {idle.t1:.1f} s", "bandstep")],
                            title, top=top, lanes_h=lanes_h)
    return under, over


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def timeline_svg(timeline: Mapping[str, Any]) -> str:
    """Every rank's lane over wall time (seconds since the first event); the axis starts at training."""
    ranks = sorted(timeline.get("ranks", {}).items(), key=lambda kv: int(kv[0]))
    lane_h = 30 if len(ranks) <= MAX_LANES_DRAWN_HIGH else max(4, 600 // max(len(ranks), 1))
    top, plot_w = 34, WIDTH - LABEL_W - 20
    height = top + lane_h * len(ranks) + 46
    x = TimeAxis(timeline, left=LABEL_W, right=LABEL_W + plot_w)
    end = x.end

    out, band_words = _bands(timeline, x, top=top, lanes_h=lane_h * len(ranks))
    for tick in x.ticks():
        out.append(f'<line class="grid" x1="{_f(x(tick))}" y1="{top - 4}" x2="{_f(x(tick))}" '
                   f'y2="{top + lane_h * len(ranks)}"/>')
        out.append(f'<text class="axis" x="{_f(x(tick))}" y="{top + lane_h * len(ranks) + 16}" '
                   f'text-anchor="middle">{escape(_seconds_label(tick))}</text>')
    caption = "wall time since the first rank started" + (
        f"; the axis starts at training ({x.start:.2f} s), start-up is the band at the left" if x.start > 0 else "")
    if x.band("idle") is not None:
        caption += "; the wait where no rank progressed is compressed too"
    out.append(f'<text class="axis" x="{LABEL_W + plot_w}" y="{top + lane_h * len(ranks) + 34}" text-anchor="end">'
               f"{escape(caption)}</text>")
    divergence = timeline.get("first_divergence")
    small = lane_h < 16
    diverged_at = [t for _, lane in ranks for t, n, _ in lane.get("collectives", []) if n == divergence]
    for i, (rank, lane) in enumerate(ranks):
        y0 = top + i * lane_h
        mid = y0 + lane_h / 2
        out.append(f'<g class="lane" data-rank="{escape(rank)}">')
        out.append(f'<text class="rank" x="{LABEL_W - 8}" y="{_f(mid + 4)}" text-anchor="end">'
                   f'rank {escape(rank)}</text>'
                   if not small or i % max(1, 16 // lane_h) == 0 else "")
        start = lane.get("start") or 0.0
        stop = (lane.get("end") or {}).get("t")
        lane_end = stop if stop is not None else end
        out.append(f'<rect class="alive" x="{_f(x(start))}" y="{_f(y0 + lane_h * 0.2)}" '
                   f'width="{_f(max(1.0, x(lane_end) - x(start)))}" height="{_f(lane_h * 0.6)}">'
                   f'<title>rank {escape(rank)}: process from {start:.2f} s to {lane_end:.2f} s</title></rect>')
        for a, b in lane.get("stalls", []):
            out.append(f'<rect class="stall" x="{_f(x(a))}" y="{_f(y0 + 1)}" width="{_f(max(2.0, x(b) - x(a)))}" '
                       f'height="{lane_h - 2}"><title>rank {escape(rank)}: no progress for {b - a:.1f} s '
                       f'(from {a:.1f} s)</title></rect>')
        for t, duration, path in lane.get("saves", []):
            out.append(f'<rect class="save" x="{_f(x(t))}" y="{_f(y0 + lane_h * 0.2)}" '
                       f'width="{_f(max(3.0, x(t + duration) - x(t)))}" height="{_f(lane_h * 0.6)}">'
                       f'<title>rank {escape(rank)}: torch.save {escape(path)} took {duration:.2f} s</title></rect>')
        for step in lane.get("steps", []):
            out.append(f'<line class="step" x1="{_f(x(step[0]))}" y1="{_f(y0 + lane_h * 0.25)}" '
                       f'x2="{_f(x(step[0]))}" y2="{_f(y0 + lane_h * 0.75)}"/>')
        last_label = -1e9
        for t, n, op in lane.get("collectives", []):
            px = x(t)
            diverged = divergence is not None and n == divergence
            cls = "coll diverge" if diverged else "coll"
            out.append(f'<line class="{cls}" x1="{_f(px)}" y1="{_f(y0 + 2)}" x2="{_f(px)}" y2="{_f(y0 + lane_h - 2)}">'
                       f'<title>rank {escape(rank)}: {escape(op)} #{n} at {t:.3f} s'
                       f'{" (first divergence)" if diverged else ""}</title></line>')
            if not small and (diverged or px - last_label >= 26):
                label = f"#{n}" + (" first divergence" if diverged else "")
                near_edge = px + 7 * len(label) > LABEL_W + plot_w  # keep the label inside the picture
                out.append(f'<text class="{"clabel diverge" if diverged else "clabel"}" '
                           f'x="{_f(px - 2 if near_edge else px + 2)}" y="{_f(y0 + 9)}"'
                           f'{" text-anchor=" + chr(34) + "end" + chr(34) if near_edge else ""}>{escape(label)}</text>')
                last_label = px + (90 if diverged else 0)
        if (divergence is not None and diverged_at
                and not any(n == divergence for _, n, _ in lane.get("collectives", []))):
            made = [n for _, n, _ in lane.get("collectives", [])]
            if not made or max(made) < divergence:  # where the others called it, this rank never did
                px = x(min(diverged_at))
                out.append(f'<line class="missing" x1="{_f(px)}" y1="{_f(y0 + 2)}" x2="{_f(px)}" '
                           f'y2="{_f(y0 + lane_h - 2)}"><title>rank {escape(rank)} never called collective '
                           f'#{divergence}</title></line>')
                if not small:
                    out.append(f'<text class="clabel diverge" x="{_f(px + 3)}" y="{_f(y0 + 9)}">'
                               f'never called #{divergence}</text>')
        finish = lane.get("end")
        if finish and finish.get("t") is not None:
            kind = finish.get("kind")
            glyph = {"exception": "✗", "killed": "✗", "stopped": "■", "exit": "■"}.get(kind, "■")
            cls = ("crash" if kind in ("exception", "killed")
                   or (kind == "exit" and finish.get("detail") != "exit code 0")
                   else ("stopped" if kind == "stopped" else "exit"))
            out.append(f'<text class="end {cls}" x="{_f(x(finish["t"]))}" y="{_f(mid + 5)}" text-anchor="middle">'
                       f'{glyph}<title>rank {escape(rank)}: {escape(finish.get("detail") or kind or "")} at '
                       f'{finish["t"]:.2f} s</title></text>')
        out.append("</g>")
    out += band_words
    stop = timeline.get("stop")
    if stop and stop.get("t") is not None:
        px = x(stop["t"])
        out.append(f'<line class="stopline" x1="{_f(px)}" y1="{top - 14}" x2="{_f(px)}" '
                   f'y2="{top + lane_h * len(ranks)}"/>')
        label = stop.get("label") or f"ddpdoctor stopped the job ({stop.get('reason')})"
        out.append(f'<text class="stoplabel" x="{_f(px - 4)}" y="{top - 18}" text-anchor="end">'
                   f'{escape(label)} at {stop["t"]:.1f} s</text>')
    return _svg(WIDTH, height, out, label="per-rank timeline", css_class="timeline")


def _line_chart(series: list[tuple[str, list[tuple[float, float]], str]], *, x_label: str, y_label: str,
                log_x: bool = False, x_format: Optional[Callable[[float], str]] = None,
                y_format: Optional[Callable[[float], str]] = None, title: str) -> str:
    points = [p for _, values, _ in series for p in values]
    if not points:
        return ""
    height, left, right, top, bottom = 300, 70, 150, 16, 44
    plot_w, plot_h = WIDTH - left - right, height - top - bottom

    def tx(v: float) -> float:
        return math.log2(max(v, 1e-12)) if log_x else v

    xs = [tx(p[0]) for p in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi - x_lo < 1e-12:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_hi = max(p[1] for p in points) * 1.1 or 1.0

    def sx(v: float) -> float:
        return left + plot_w * (tx(v) - x_lo) / (x_hi - x_lo)

    def sy(v: float) -> float:
        return top + plot_h * (1 - v / y_hi)

    out: list[str] = []
    for tick in nice_ticks(0.0, y_hi, 5):
        out.append(f'<line class="grid" x1="{left}" y1="{_f(sy(tick))}" x2="{left + plot_w}" y2="{_f(sy(tick))}"/>')
        out.append(f'<text class="axis" x="{left - 6}" y="{_f(sy(tick) + 4)}" text-anchor="end">'
                   f'{escape(y_format(tick) if y_format else f"{tick:g}")}</text>')
    if log_x:
        x_ticks = [2.0 ** e for e in range(math.floor(x_lo), math.ceil(x_hi) + 1) if e % 2 == math.floor(x_lo) % 2]
    else:
        x_ticks = nice_ticks(2 ** x_lo if log_x else x_lo, 2 ** x_hi if log_x else x_hi, 8)
    for tick in x_ticks:
        if not (x_lo - 1e-9 <= tx(tick) <= x_hi + 1e-9):
            continue
        out.append(f'<text class="axis" x="{_f(sx(tick))}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{escape(x_format(tick) if x_format else f"{tick:g}")}</text>')
    out.append(f'<line class="axisline" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}"/>')
    out.append(f'<text class="axis" x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text class="axis" x="14" y="{top + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + plot_h / 2})">{escape(y_label)}</text>')
    for i, (name, values, color) in enumerate(series):
        if not values:
            continue
        path = " ".join(f"{_f(sx(a))},{_f(sy(b))}" for a, b in values)
        out.append(f'<g class="series" data-name="{escape(name)}"><polyline points="{path}" fill="none" '
                   f'stroke="{color}" stroke-width="1.6"><title>{escape(name)}</title></polyline>')
        if len(values) <= 60:
            for a, b in values:
                out.append(f'<circle cx="{_f(sx(a))}" cy="{_f(sy(b))}" r="2.5" fill="{color}"><title>{escape(name)}: '
                           f'{escape(x_format(a) if x_format else f"{a:g}")}, '
                           f'{escape(y_format(b) if y_format else f"{b:g}")}</title></circle>')
        out.append("</g>")
        ly = top + 14 + 16 * i
        out.append(f'<rect x="{left + plot_w + 14}" y="{ly - 9}" width="12" height="3" fill="{color}"/>'
                   f'<text class="legend" x="{left + plot_w + 30}" y="{ly - 4}">{escape(name)}</text>')
    return _svg(WIDTH, height, out, label=title, css_class="chart")


def _step_seconds(steps: list[Any]) -> list[tuple[float, float]]:
    """(step number, seconds per step) between consecutive kept steps (a thinned run averages)."""
    out = []
    for previous, current in zip(steps, steps[1:]):
        dn = current[1] - previous[1]
        dt = current[0] - previous[0]
        if dn > 0 and dt >= 0:
            out.append((float(current[1]), dt / dn))
    return out


def _seconds_axis(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def step_time_svg(timeline: Mapping[str, Any], *, max_lines: int = 16) -> str:
    """Seconds per optimizer step over the run, per rank; empty when no rank made two steps."""
    per_rank = {int(r): _step_seconds(lane.get("steps", [])) for r, lane in timeline.get("ranks", {}).items()}
    per_rank = {r: v for r, v in per_rank.items() if v}
    if not any(len(v) >= 2 for v in per_rank.values()):  # one interval per rank draws no line
        return ""
    if len(per_rank) <= max_lines:
        series = [(f"rank {r}", v, PALETTE[i % len(PALETTE)]) for i, (r, v) in enumerate(sorted(per_rank.items()))]
    else:
        totals = {r: sum(s for _, s in v) / len(v) for r, v in per_rank.items()}
        slowest = max(totals, key=lambda r: totals[r])
        by_step: dict[float, list[float]] = {}
        for values in per_rank.values():
            for n, s in values:
                by_step.setdefault(n, []).append(s)
        median = [(n, sorted(v)[len(v) // 2]) for n, v in sorted(by_step.items())]
        series = [("median of ranks", median, PALETTE[0]), (f"slowest: rank {slowest}", per_rank[slowest], PALETTE[1])]
    return _line_chart(series, x_label="optimizer step", y_label="time per step", y_format=_seconds_axis,
                       x_format=lambda v: f"{v:g}", title="step time per rank")


def bandwidth_svg(benchmark: Mapping[str, Any]) -> str:
    """Bus bandwidth (GB/s) against message size, one line per collective."""
    by_op: dict[str, list[tuple[float, float]]] = {}
    for row in benchmark.get("rows", []):
        by_op.setdefault(row["op"], []).append((float(row["bytes"]), float(row["busbw_gbps"])))
    series = [(op, sorted(v), PALETTE[i % len(PALETTE)]) for i, (op, v) in enumerate(by_op.items())]
    return _line_chart(series, x_label="message size", y_label="bus bandwidth (GB/s)", log_x=True,
                       x_format=lambda v: format_bytes(int(v)), y_format=lambda v: f"{v:.3g}",
                       title="bus bandwidth against message size")
