"""The dump request over an evidence directory, from the side that asks.

Whoever wants the ranks' evidence flushed and their stacks (the supervisor before it stops a hung
job, the torchrun agent before it stops the survivors of a failed rank) writes a fresh token into
``dump-request``; each rank's watchdog answers once per token with ``stack-<pid>.json`` at its
next heartbeat, after flushing what it holds (the collectives DDP issued since the last event, the
open data passes). One protocol, declared here for both askers.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Callable, Iterable, Optional

from ddpdoctor.schema import layout

__all__ = ["POLL_S", "request_dumps", "read_answer"]

POLL_S = 0.05


def _write_token(directory: str, token: str) -> None:
    path = layout.dump_request_path(directory)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(token)
    os.replace(tmp, path)


def read_answer(directory: str, pid: int, token: str) -> Optional[dict[str, Any]]:
    """The stack dump ``pid`` wrote for ``token``; None while it has not answered."""
    try:
        with open(layout.stack_path(directory, pid)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("token") == token else None


def request_dumps(directory: str, pids: Iterable[int], wait_s: float,
                  still_waiting: Callable[[int], bool] = lambda pid: True) -> dict[int, dict[str, Any]]:
    """Ask the rank processes ``pids`` for a dump; wait up to ``wait_s`` for their answers, but no
    longer for a process ``still_waiting`` says to give up on (it exited). pid -> the answer."""
    token = uuid.uuid4().hex
    _write_token(directory, token)
    deadline = time.monotonic() + wait_s
    waiting = set(pids)
    answers: dict[int, dict[str, Any]] = {}
    while waiting and time.monotonic() < deadline:
        for pid in sorted(waiting):
            answer = read_answer(directory, pid, token)
            if answer is not None:
                answers[pid] = answer
                waiting.discard(pid)
            elif not still_waiting(pid):
                waiting.discard(pid)
        if waiting:
            time.sleep(POLL_S)
    return answers
