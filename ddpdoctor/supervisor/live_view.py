"""The live view's words: what each rank does, the job's progress and its start-up phases.

Pure functions of the ranks' heartbeats and the monitor's clock, so the view is unit-tested on
synthetic heartbeats; :mod:`ddpdoctor.supervisor.display` draws them. Every state comes from what the
rank's watchdog saw its main thread doing at the heartbeat (``Heartbeat.state``), never from the
last note a probe happened to leave: a rank blocked in DDP's gradient all-reduce says so.
"""

from __future__ import annotations

import signal
import textwrap
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.schema.observations import Heartbeat

STALE_BEAT_S = 3.0  # a heartbeat older than this: the rank's process is frozen, stopped or gone


def duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``: rounded as a person reads a timer."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def exit_text(exitcode: int) -> str:
    """How torchrun saw a rank's process end: ``killed by SIGKILL``, ``exited with code 1``."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _headline(text: str, limit: int = 90) -> str:
    """An error's first sentence, or its first words, whole (the report has all of it)."""
    end = text.find(". ")
    if 0 < end < limit:
        return text[: end + 1]
    return textwrap.shorten(text, limit, placeholder=" …")


def short_site(site: Optional[dict]) -> str:
    if not site or not site.get("file"):
        return ""
    name = str(site["file"]).replace("\\", "/").rsplit("/", 1)[-1]
    function = f" ({site['function']})" if site.get("function") else ""
    return f"{name}:{site.get('line')}{function}"


@dataclass(frozen=True)
class RankRow:
    rank: int
    host: str
    step: str
    epoch: str
    doing: str
    where: str
    last_collective: str
    alarm: bool  # the row needs the eye: crashed, killed, frozen, or waiting long


def rank_row(beat: Heartbeat, now: float, *, exitcode: Optional[int] = None) -> RankRow:
    """One rank's line, from its newest heartbeat at the monitor's wall-clock ``now``."""
    state, detail = beat.state or "starting", beat.detail
    elapsed = now - beat.since if beat.since else 0.0
    alarm = False
    if state == "waiting":
        doing = f"waiting in {detail or 'a collective'} for {duration(elapsed)}"
        alarm = elapsed >= 5
    elif state == "computing":
        doing = f"computing ({detail})" if detail else "computing"
    elif state in ("loading data", "saving a checkpoint", "loading a checkpoint"):
        doing = state + (f" for {duration(elapsed)}" if elapsed >= 1 else "")
    elif state == "finished":
        doing = "finished" + (f" ({detail})" if detail else "")
    elif state == "crashed":
        doing, alarm = f"crashed: {_headline(detail)}" if detail else "crashed", True
    elif state == "importing":
        doing = "importing torch and the probes"
    else:
        doing = "starting the script"
    if exitcode is not None and state not in ("finished", "crashed"):
        doing, alarm = exit_text(exitcode), True
    elif state not in ("finished", "crashed") and beat.t and now - beat.t > STALE_BEAT_S:
        doing, alarm = f"{doing}; no heartbeat for {duration(now - beat.t)}", True
    epoch = beat.epoch if beat.epoch is not None else (beat.passes if beat.steps else None)
    last = beat.last_collective or {}
    return RankRow(rank=beat.rank if beat.rank is not None else -1, host=beat.host, step=str(beat.steps),
                   epoch="" if epoch is None else str(epoch), doing=doing, where=short_site(beat.where),
                   last_collective=f"#{last['n']} {last.get('op', '')}".strip() if last.get("n") else "",
                   alarm=alarm)


def header(beats: dict[int, Heartbeat], elapsed_s: float, *, stall_s: Optional[float] = None,
           threshold_s: Optional[float] = None) -> str:
    """The line above the table: start-up phase and timer, or the job's progress against the hang
    threshold (``no progress 12 s / hang at 30 s``) and the newest collective."""
    timer = duration(elapsed_s)
    if not beats:
        return f"ddpdoctor: starting · {timer} · launching torchrun agents and rendezvous"
    world = max([b.world_size or 0 for b in beats.values()] + [len(beats)])
    started = sum(1 for b in beats.values() if b.state != "importing")
    if started < world:
        importing = sum(1 for b in beats.values() if b.state == "importing")
        waiting = world - len(beats)
        phase = f"importing torch on {importing} of {world} ranks" if importing else "ranks starting"
        if waiting:
            phase += f", {waiting} not started yet"
        return f"ddpdoctor: starting {world} ranks · {timer} · {phase}"
    parts = [f"ddpdoctor: {world} ranks", timer]
    if all(b.state in ("finished", "crashed") for b in beats.values()):
        parts.append("every rank ended")
    elif not any(b.steps for b in beats.values()):
        parts.append("script started, no optimizer step yet")
    if stall_s is not None and threshold_s and stall_s >= max(2.0, threshold_s / 10):  # not every quiet beat
        parts.append(f"no progress {duration(stall_s)} / hang at {duration(threshold_s)}")
    newest = max((b.last_collective.get("n") or 0 for b in beats.values() if b.last_collective), default=0)
    if newest:
        parts.append(f"last collective #{newest}")
    return " · ".join(parts)
