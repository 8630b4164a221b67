"""A daemon thread in every rank: heartbeats for the monitor and stack dumps on request.

It reads the main thread's stack with sys._current_frames(), which works while the main thread is
blocked inside a collective in C++ because torch releases the GIL while it waits. Every heartbeat
classifies that stack (the rules of :mod:`ddpdoctor.schema.rank_state`, which the hang policy uses
too), so the live view shows what the rank does now: computing, waiting in all_reduce #5 for 3 s,
loading data, saving a checkpoint. Beats fall on wall-clock ticks (multiples of the interval), so
all ranks of a host sample their counters at the same instant and their step counts compare.

It speaks only through files in the evidence directory; inside an existing launch, the rank's own
ddpdoctor process relays them over the job's store.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time
from types import FrameType
from typing import Optional

from ddpdoctor.rank import callsite
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema import layout, rank_state
from ddpdoctor.schema.observations import Heartbeat, StackDump

MAX_FRAMES = 80


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, default=str)
    os.replace(tmp, path)


def main_thread_stack() -> list[dict]:
    frame = sys._current_frames().get(threading.main_thread().ident)
    return callsite.format_stack(frame) if frame is not None else []


def light_stack(frame: Optional[FrameType], limit: int = MAX_FRAMES) -> list[dict]:
    """The stack of ``frame``, outermost first, as the classifier reads it: cheaper than
    :func:`callsite.format_stack` (source text only for DDP's own frames, whose code it inspects)."""
    frames: list[dict] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        filename = code.co_filename
        entry = {"file": filename, "line": frame.f_lineno, "function": code.co_name,
                 "user": callsite.is_user_file(filename)}
        if filename.replace("\\", "/").endswith(rank_state.DDP_FILE):
            entry["code"] = linecache.getline(filename, frame.f_lineno).strip()
        frames.append(entry)
        frame = frame.f_back
    frames.reverse()
    return frames


class LiveState:
    """What the rank does, sampled at each heartbeat, and since when."""

    def __init__(self) -> None:
        self.key: tuple = ()
        self.since = time.time()
        self.where: Optional[dict] = None

    def sample(self, rec: Recorder, frame: Optional[FrameType], now: float) -> dict:
        if rec.activity == "exited":  # where it was last seen: the line a crashed rank died on
            (state, detail), where = _ending(rec.exit_info), self.where
        elif rec.activity == "importing":  # no stack walk: it would wait for torch's import to finish
            state, detail, where = "importing", None, None
        else:
            stack = light_stack(frame)
            state, detail = rank_state.live_state(stack, rec.activity, gradients_complete=rec.gradients_complete)
            user = [f for f in stack if f.get("user")]
            where = {k: user[-1][k] for k in ("file", "line", "function")} if user else None
        self.where = where
        key = (state, detail)
        if key != self.key:
            self.key = key
            # A collective's note carries the time it began; a state seen first now began by now.
            self.since = rec.activity_t if detail and rec.activity == f"in {detail}" else now
        return {"state": state, "detail": detail, "since": self.since, "where": where}


def _ending(exit_info: Optional[dict]) -> tuple[str, Optional[str]]:
    """(state, detail) of a script that ended: finished, or crashed with its exception or exit code."""
    info = exit_info or {}
    if info.get("exception"):
        return "crashed", info["exception"]
    if info.get("code") not in (None, 0):
        return "crashed", f"exit code {info['code']}"
    if info.get("cut"):
        return "finished", f"stopped at --{info['cut']}"
    return "finished", None


class Watchdog(threading.Thread):
    def __init__(self, rec: Recorder, *, interval_s: float = 0.5) -> None:
        super().__init__(name="ddpdoctor-watchdog", daemon=True)
        self.rec = rec
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        self._last_token = ""
        self._live = LiveState()
        self._main_ident = threading.main_thread().ident

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._beat()
            self._serve_dump_request()
            self._stop_event.wait(self._until_next_tick())

    def _until_next_tick(self, now: Optional[float] = None) -> float:
        """Seconds from ``now`` (the wall clock's time by default) to the next multiple of the
        interval on the wall clock: every rank beats at the same instants."""
        now = time.time() if now is None else now
        return self.interval_s - (now % self.interval_s)

    def heartbeat(self) -> Heartbeat:
        """The recorder's counters plus what the main thread does right now."""
        beat = self.rec.heartbeat()
        try:
            frame = sys._current_frames().get(self._main_ident)
            live = self._live.sample(self.rec, frame, beat.t)
            del frame
        except Exception:  # a heartbeat without a state beats no heartbeat
            return beat
        beat.state, beat.detail, beat.since, beat.where = live["state"], live["detail"], live["since"], live["where"]
        return beat

    def _beat(self) -> None:
        if self.rec.activity == "importing":
            self.rec.progress += 1  # importing torch is work: not a stall
        try:
            write_json_atomic(layout.heartbeat_path(self.rec.evidence_dir, self.rec.pid), self.heartbeat().to_json())
        except OSError:
            pass  # evidence dir removed: the supervisor is gone or done

    def _serve_dump_request(self) -> None:
        try:
            with open(layout.dump_request_path(self.rec.evidence_dir)) as f:
                token = f.read().strip()
        except OSError:
            return
        dump = self.dump(token)
        if dump is not None:
            try:
                write_json_atomic(layout.stack_path(self.rec.evidence_dir, self.rec.pid), dump.to_json())
            except OSError:
                pass

    def dump(self, token: str) -> Optional[StackDump]:
        """Answer a dump request once: flush open evidence, then the main thread's stack."""
        if not token or token == self._last_token:
            return None
        self._last_token = token
        progress = self.rec.progress  # writing evidence on request is not the rank making progress
        for callback in self.rec.on_dump:
            try:
                callback()
            except Exception as exc:  # evidence is best effort; the stack matters most
                self.rec.probe_failed("watchdog", exc, target="dump")
        self.rec.progress = progress
        return StackDump(token=token, heartbeat=self.heartbeat(), stack=main_thread_stack())

    def stop(self) -> None:
        """Stop beating, after one last heartbeat that carries the final state. The thread is
        joined: a daemon thread still inside a C++ call (the collective clock reads the process
        group) when the interpreter finalizes aborts the process ("terminate called without an
        active exception")."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2 * self.interval_s + 1)
        self._beat()
