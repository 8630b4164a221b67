"""A daemon thread in every rank: heartbeats for the monitor and stack dumps on request.

It reads the main thread's stack with sys._current_frames(), which works while the main thread is
blocked inside a collective in C++ because torch releases the GIL while it waits. It speaks only
through files in the evidence directory; inside an existing launch, the rank's own ddpdoctor
process relays them over the job's store.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Optional

from ddpdoctor.rank import callsite
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema import layout
from ddpdoctor.schema.observations import StackDump


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, default=str)
    os.replace(tmp, path)


def main_thread_stack() -> list[dict]:
    frame = sys._current_frames().get(threading.main_thread().ident)
    return callsite.format_stack(frame) if frame is not None else []


class Watchdog(threading.Thread):
    def __init__(self, rec: Recorder, *, interval_s: float = 0.5) -> None:
        super().__init__(name="ddpdoctor-watchdog", daemon=True)
        self.rec = rec
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        self._last_token = ""

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._beat()
            self._serve_dump_request()
            self._stop_event.wait(self.interval_s)

    def _beat(self) -> None:
        try:
            write_json_atomic(layout.heartbeat_path(self.rec.evidence_dir, self.rec.pid), self.rec.heartbeat().to_json())
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
        return StackDump(token=token, heartbeat=self.rec.heartbeat(), stack=main_thread_stack())

    def stop(self) -> None:
        """Stop beating, after one last heartbeat that carries the final state. The thread is
        joined: a daemon thread still inside a C++ call (the collective clock reads the process
        group) when the interpreter finalizes aborts the process ("terminate called without an
        active exception")."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2 * self.interval_s + 1)
        self._beat()
