"""A daemon thread in every rank: heartbeats for the supervisor and stack dumps on request.

It reads the main thread's stack with sys._current_frames(), which works while the main thread is
blocked inside a collective in C++ because torch releases the GIL while it waits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Optional

from ddpdoctor import callsite
from ddpdoctor.recorder import Recorder

DUMP_REQUEST = "dump-request"


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
        self._last_request = ""

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.tick()
            self._stop_event.wait(self.interval_s)

    def tick(self) -> None:
        """One heartbeat and one look for requests; the file-based channel of launch modes 1 and 3."""
        self._beat()
        try:
            self._serve_dump_request(os.path.join(self.rec.evidence_dir, DUMP_REQUEST))
        except OSError:
            pass

    def _beat(self) -> None:
        try:
            write_json_atomic(os.path.join(self.rec.evidence_dir, f"hb-{self.rec.pid}.json"), self.rec.heartbeat())
        except OSError:
            pass  # evidence dir removed: the supervisor is gone or done

    def _serve_dump_request(self, request_path: str) -> None:
        try:
            with open(request_path) as f:
                token = f.read().strip()
        except FileNotFoundError:
            return
        payload = self.dump(token)
        if payload is not None:
            write_json_atomic(os.path.join(self.rec.evidence_dir, f"stack-{self.rec.pid}.json"), payload)

    def dump(self, token: str) -> Optional[dict]:
        """Answer a dump request once: flush open evidence, then the main thread's stack."""
        if not token or token == self._last_request:
            return None
        self._last_request = token
        for callback in self.rec.on_dump:
            try:
                callback()
            except Exception as exc:  # evidence is best effort; the stack matters most
                self.rec.emit("probe_error", probe="dump", error=repr(exc))
        return {"token": token, "t": time.time(), **self.rec.heartbeat(), "stack": main_thread_stack()}

    def stop(self) -> None:
        """Stop beating, after one last heartbeat that carries the final state."""
        self._stop_event.set()
        self._beat()
