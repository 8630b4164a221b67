"""``--trace PATH``: the run as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
chrome://tracing open.

One process per rank (``pid`` = the rank) with the main thread's track: optimizer steps as spans,
inside them the phases the probes saw (forward from the first DDP forward to the first gradient,
backward while gradients arrive, the optimizer's step, the time spent waiting for the DataLoader),
collectives as instants named with their sequence number, checkpoint writes as spans; a second
track per rank carries what ddpdoctor observed (stalls, the end of the process, its stop of the
job). Built from the report's ``timeline``, so a saved JSON report gives the same trace.
DataLoader workers get no track: the probes see batches where the main process receives them.
"""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.analysis.report import Report

__all__ = ["render_trace", "MAIN", "OBSERVED"]

MAIN, OBSERVED = 0, 1


def _us(seconds: Optional[float]) -> float:
    return round(float(seconds or 0.0) * 1e6, 1)


def _span(name: str, cat: str, pid: int, start: float, end: float, tid: int = MAIN,
          args: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start),
             "dur": max(_us(end) - _us(start), 0.0)}
    if args:
        event["args"] = args
    return event


def _step_events(rank: int, steps: list[Any], start: float, end: Optional[float] = None) -> list[dict[str, Any]]:
    """A span per step (from the previous step's end), its phases inside it, in order and never
    overlapping one another, so every viewer nests them under their step."""
    events: list[dict[str, Any]] = []
    previous_end = start
    previous_n: Optional[int] = None
    for step in steps:
        t, n = step[0], step[1]
        data, forward, backward, backward_end, optimizer = (list(step[2:7]) + [None] * 5)[:5]
        if previous_n is None and forward is not None:  # the first step begins at its data or forward
            begin = max(start, t - forward - (data or 0.0))
            if begin > start:
                events.append(_span("before the first step", "startup", rank, start, begin,
                                    args={"what": "the script's start: imports, init_process_group, model, data"}))
            previous_end = begin
        label = f"step {n}" if previous_n is None or n == previous_n + 1 else f"steps {previous_n + 1}-{n}"
        events.append(_span(label, "step", rank, previous_end, t, args={"step": n}))
        cursor = previous_end  # phases follow one another inside [previous_end, t]

        def phase(name: str, cat: str, begin: float, end: float, args: Optional[dict[str, Any]] = None) -> None:
            nonlocal cursor
            # called only within this iteration, so `t` is this step's
            begin, end = max(begin, cursor), min(end, t)  # noqa: B023
            if end > begin:
                events.append(_span(name, cat, rank, begin, end, args=args))
                cursor = end

        forward_at = t - forward if forward is not None else None
        if data:
            waited_until = forward_at if forward_at is not None else t
            phase("data wait", "data", waited_until - data, waited_until,
                  {"seconds in DataLoader.__next__ since the previous step": data})
        if forward_at is not None:
            phase("forward", "phase", forward_at, t - backward if backward is not None else
                  (t - optimizer if optimizer is not None else t),
                  {"from": "the first DDP forward", "to": "the first gradient"})
        if backward is not None and backward_end is not None:
            phase("backward", "phase", t - backward, t - backward_end,
                  {"from": "the first gradient", "to": "the last gradient (DDP's all-reduce may go on after it)"})
        if optimizer is not None:
            phase("optimizer.step", "phase", t - optimizer, t)
        previous_end, previous_n = t, n
    if previous_n is not None and end is not None and end > previous_end:
        events.append(_span(f"after step {previous_n}", "step", rank, previous_end, end,
                            args={"what": "from the last optimizer step to the end of the process"}))
    return events


def render_trace(report: Report) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...]}``) of a report; empty events without a timeline."""
    timeline = report.timeline or {}
    hosts = {r.get("rank"): r.get("host") for r in report.ranks}
    divergence = timeline.get("first_divergence")
    events: list[dict[str, Any]] = []
    for key, lane in sorted((timeline.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        rank = int(key)
        host = hosts.get(rank)
        events += [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": MAIN, "ts": 0,
             "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": MAIN, "ts": 0, "args": {"sort_index": rank}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": MAIN, "ts": 0, "args": {"name": "main thread"}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": OBSERVED, "ts": 0,
             "args": {"name": "observed by ddpdoctor"}},
        ]
        start = lane.get("start") or 0.0
        finish = (lane.get("end") or {}).get("t")
        events += _step_events(rank, lane.get("steps", []), start, finish)
        for t, n, op in lane.get("collectives", []):
            name = f"{op} #{n}" + (" (first divergence)" if n == divergence else "")
            events.append({"name": name, "cat": "collective", "ph": "i", "s": "t", "pid": rank, "tid": MAIN,
                           "ts": _us(t), "args": {"op": op, "sequence": n}})
        for t, duration, path in lane.get("saves", []):
            events.append(_span(f"torch.save {path}".strip(), "checkpoint", rank, t, t + duration))
        for a, b in lane.get("stalls", []):
            events.append(_span("no progress", "stall", rank, a, b, tid=OBSERVED))
        end = lane.get("end")
        if end and end.get("t") is not None:
            events.append({"name": end.get("detail") or end.get("kind"), "cat": f"end.{end.get('kind')}", "ph": "i",
                           "s": "p", "pid": rank, "tid": OBSERVED, "ts": _us(end["t"])})
    stop = timeline.get("stop")
    if stop and stop.get("t") is not None:
        events.append({"name": stop.get("label") or f"ddpdoctor stopped the job ({stop.get('reason')})",
                       "cat": "stop", "ph": "i",
                       "s": "g", "pid": 0, "tid": OBSERVED, "ts": _us(stop["t"])})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": f"ddpdoctor {report.version}", "script": report.script or "reference job",
                          "outcome": report.outcome, "t0_unix_s": timeline.get("t0")}}
