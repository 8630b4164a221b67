"""A compact per-rank timeline of the run, for the report's pictures (--html) and --trace.

Built from the evidence once, kept in the JSON report (``timeline``), so ``ddpdoctor report`` draws
the same pictures elsewhere. Times are seconds since the first event of the job (``t0``, wall clock).
``startup`` says when training began (``end``: the first DDP forward, optimizer step or collective of
any rank) and what the ranks did before (``milestones``: [[what, t], ...], each the first rank to get
there), so a picture can give start-up a band of its own and its axis to training; null when no rank
trained. ``stop.label`` says who stopped the job (ddpdoctor, or the flight recorder dumps of a job
that hung on its own).
Bounded for long runs and many ranks: every rank keeps at most ``points_per_rank(world_size)`` steps
and as many collectives (evenly thinned steps, the last collectives, those around the first
divergence), and says how many it dropped.

Per rank::

    {"start": s, "steps": [[t, n, data, forward, backward, backward_end, optimizer], ...],
     "collectives": [[t, n, op or what DDP's own one was for], ...], "saves": [[t, duration, file name], ...],
     "stalls": [[from, to], ...], "end": {"t", "kind", "detail"} | null,
     "dropped_steps": k, "dropped_collectives": k}

A step's ``t`` is when it ended; ``data`` is the seconds it waited in DataLoader.__next__, the next
four how many seconds before ``t`` its first forward, first and last gradient and optimizer step
began (null where not seen). ``end.kind``: "exit" (code in detail), "exception", "killed",
"stopped" (ddpdoctor stopped the job).
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from ddpdoctor.analysis.evidence import Evidence, RankEvidence
from ddpdoctor.analysis.facts import collectives
from ddpdoctor.schema.events import (Collective, DDPWrap, Exit, ExceptionEvent, InitProcessGroup, InternalCollectives,
                                     InternalPhase, ProcessStart, RankEnvironment, Save, Step, SysExit)

__all__ = ["build_timeline", "points_per_rank", "TOTAL_POINTS"]

TOTAL_POINTS = 50_000  # steps (and, separately, collectives) kept over all ranks
MAX_PER_RANK = 2_000
MIN_PER_RANK = 20

_Item = TypeVar("_Item")
# (t, number, what) of one collective a rank took part in
_Call = tuple[float, int, str]
AROUND_DIVERGENCE = 3


def points_per_rank(world_size: int) -> int:
    return max(MIN_PER_RANK, min(MAX_PER_RANK, TOTAL_POINTS // max(world_size, 1)))


def _r(t: Optional[float], t0: float) -> Optional[float]:
    return None if t is None else round(t - t0, 4)


def _thin(items: list[_Item], limit: int) -> list[_Item]:
    """At most ``limit`` items evenly spread, the first and the last always kept."""
    if len(items) <= limit:
        return items
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]


# DDP's own collectives (InternalCollectives.phase) as the timeline names them.
_INTERNAL = {phase.value: phase.words for phase in InternalPhase}


def _collectives(ev: RankEvidence, stalled_since: Optional[float] = None) -> list[_Call]:
    """(t, number, what) of every collective the rank took part in: its own calls and, where the
    backend numbers them, DDP's (one entry per number), in the order of their numbers."""
    calls: list[_Call] = [(c.t, c.n, c.op) for c in ev.of(Collective) if c.n]
    previous_t: Optional[float] = None
    for event in ev.events:
        if isinstance(event, InternalCollectives):
            # Booked when the main thread next runs a probe, soon after DDP issued them; booked
            # while the rank was stalled means at the stack dump, long after: the rank's previous
            # event is then the closer bound on when they were issued.
            late = stalled_since is not None and event.t >= stalled_since
            at = previous_t if late and previous_t is not None else event.t
            what = _INTERNAL.get(event.phase, event.phase)
            calls += [(at, n, what) for n in range(event.first, event.first + event.count)]
        elif event.t:
            previous_t = event.t
    return sorted(calls, key=lambda c: (c[1], c[0]))


def _keep_collectives(calls: list[_Call], limit: int, divergence: Optional[int]) -> list[_Call]:
    """The last collectives (where a hang is), the first ones and those around the divergence."""
    if len(calls) <= limit:
        return calls
    keep = set(range(len(calls) - limit * 3 // 4, len(calls))) | set(range(limit // 8))
    if divergence is not None:
        keep |= {i for i, c in enumerate(calls) if abs(c[1] - divergence) <= AROUND_DIVERGENCE}
    return [c for i, c in enumerate(calls) if i in keep]


def _end(evidence: Evidence, rank: int, t0: float) -> Optional[dict[str, Any]]:
    ev = evidence.ranks[rank]
    exception = next(iter(ev.of(ExceptionEvent)), None)
    if exception is not None:
        headline = (exception.message.strip().splitlines() or [""])[0]
        return {"t": _r(exception.t, t0), "kind": "exception", "detail": f"{exception.type}: {headline}"[:160]}
    sys_exit = next(iter(ev.of(SysExit)), None)
    if sys_exit is not None:
        return {"t": _r(sys_exit.t, t0), "kind": "exit", "detail": f"exit code {sys_exit.code}"}
    exit_event = next(iter(ev.of(Exit)), None)
    if exit_event is not None:
        return {"t": _r(exit_event.t, t0), "kind": "exit", "detail": f"exit code {exit_event.code}"}
    failure = next((f for f in evidence.failures if f.rank == rank), None)
    stop = evidence.stop
    if stop is not None and stop.t:
        detail = (f"flight recorder dump ({stop.reason})" if evidence.post_mortem
                  else f"stopped by ddpdoctor ({stop.reason})")
        return {"t": _r(stop.t, t0), "kind": "stopped", "detail": detail}
    if failure is not None:
        last = ev.events[-1].t if ev.events else failure.t
        detail = failure.signal or f"exit code {failure.exitcode}"
        return {"t": _r(last, t0), "kind": "killed", "detail": detail}
    return None


# What the ranks do before training, in the order they do it: (event, what reaching it means).
_MILESTONES = ((RankEnvironment, "import torch"), (InitProcessGroup, "init_process_group"), (DDPWrap, "DDP wrap"))


def _training_start(evidence: Evidence) -> Optional[float]:
    """Wall time of the first sign of training on any rank: its first DDP forward (a step's timing),
    optimizer step or collective (its own calls and DDP's); None when no rank trained."""
    found = []
    for ev in evidence.ranks.values():
        first_step = next(iter(ev.of(Step)), None)
        if first_step is not None:
            forward = (first_step.timing or [None] * 5)[1]
            found.append(first_step.t - forward if forward is not None else first_step.t)
        found += [c.t for c in ev.of(Collective)[:1] if c.t]
        found += [c.t for c in ev.of(InternalCollectives)[:1] if c.t]
    return min(found) if found else None


def _startup(evidence: Evidence, t0: float) -> Optional[dict[str, Any]]:
    """Start-up, from the first process start to training: its end and the milestones reached."""
    start = _training_start(evidence)
    if start is None or start <= t0:
        return None
    milestones = []
    for kind, what in _MILESTONES:
        times = [e.t for ev in evidence.ranks.values() for e in ev.of(kind)[:1] if t0 <= e.t <= start]
        if times:
            milestones.append([what, _r(min(times), t0)])
    return {"end": _r(start, t0), "milestones": milestones}


def _stop(evidence: Evidence, t0: float) -> Optional[dict[str, Any]]:
    stop = evidence.stop
    if stop is None or not stop.t:
        return None
    label = (f"flight recorder dumps ({stop.reason})" if evidence.post_mortem  # the job stopped on its own
             else f"ddpdoctor stopped the job ({stop.reason})")
    return {"t": _r(stop.t, t0), "reason": stop.reason, "label": label}


def build_timeline(evidence: Evidence) -> Optional[dict[str, Any]]:
    """The report's ``timeline``, None when no rank wrote an event."""
    times = [ev.events[0].t for ev in evidence.ranks.values() if ev.events and ev.events[0].t]
    if not times:
        return None
    t0 = min(times)
    limit = points_per_rank(max(evidence.world_size, len(evidence.ranks)))
    mismatch = collectives.divergence(evidence)
    divergence = mismatch.n if mismatch is not None else None
    stop = evidence.stop
    ranks: dict[str, dict[str, Any]] = {}
    latest = 0.0
    for rank in sorted(evidence.ranks):
        ev = evidence.ranks[rank]
        steps = [e for e in ev.of(Step)]
        kept_steps = _thin(steps, limit)
        stalled = stop.ranks.get(rank) if stop is not None and stop.t else None
        stalled_since = (stop.t - stalled.stalled_s if stop is not None and stalled is not None and stalled.stalled_s
                         else None)
        calls = _collectives(ev, stalled_since)
        kept_calls = _keep_collectives(calls, limit, divergence)
        start = next((e.t for e in ev.of(ProcessStart)), ev.events[0].t if ev.events else t0)
        stalls = []
        for snapshot in [*evidence.observations.stalls, *([stop] if stop is not None else [])]:
            state = snapshot.ranks.get(rank)
            if state is not None and state.stalled_s and snapshot.t:
                stalls.append([_r(snapshot.t - state.stalled_s, t0), _r(snapshot.t, t0)])
        entry: dict[str, Any] = {
            "start": _r(start, t0),
            "steps": [[_r(s.t, t0), s.step, *(s.timing or [None] * 5)] for s in kept_steps],
            "collectives": [[_r(t, t0), n, what] for t, n, what in kept_calls],
            "saves": [[_r(s.t - (s.dur_s or 0.0), t0), round(s.dur_s or 0.0, 4), (s.path or "").rsplit("/", 1)[-1]]
                      for s in ev.of(Save) if s.done][-limit:],
            "stalls": stalls,
            "end": _end(evidence, rank, t0),
            "dropped_steps": len(steps) - len(kept_steps),
            "dropped_collectives": len(calls) - len(kept_calls),
        }
        ranks[str(rank)] = entry
        if ev.events:
            latest = max(latest, ev.events[-1].t - t0)
        if entry["end"] and entry["end"]["t"] is not None:
            latest = max(latest, entry["end"]["t"])
    if stop is not None and stop.t:
        latest = max(latest, stop.t - t0)
    return {"t0": t0, "end": round(latest, 4), "first_divergence": divergence, "stop": _stop(evidence, t0),
            "startup": _startup(evidence, t0), "points_per_rank": limit, "ranks": ranks}
