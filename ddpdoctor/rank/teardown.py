"""A rank's last moments: let the process group's worker threads finish before the interpreter does.

gloo runs collectives on its own threads ("pt_gloo_runloop"). When a script's last collective
completes, the main thread goes on at once, while the worker still holds the finished work and
releases it a moment later; releasing it touches a Python object, which needs the interpreter's
lock. If the main thread has begun finalizing by then, the worker is stopped with pthread_exit
inside a C++ destructor and the process aborts ("terminate called without an active exception",
SIGABRT) after the script had finished cleanly: about one plain torchrun run of a tiny DDP script
in four on this machine. Waiting until those threads sleep again, with the lock released, costs a
few milliseconds and removes the race.
"""

from __future__ import annotations

import os
import time

WORKER_NAMES = ("pt_gloo_runloop",)
MAX_WAIT_S = 0.5
POLL_S = 0.005


def _busy_workers() -> int:
    """Backend worker threads of this process that are running (not asleep in their queue)."""
    busy = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux: nothing to look at
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name not in WORKER_NAMES:
                continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:  # the thread ended meanwhile
            continue
        if state not in ("S", "D", "T", "t", "Z", "X"):
            busy += 1
    return busy


def settle_backend_threads(max_wait_s: float = MAX_WAIT_S) -> None:
    """Return once no backend worker thread has run for two polls in a row (or after ``max_wait_s``)."""
    deadline = time.monotonic() + max_wait_s
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(POLL_S)  # releases the interpreter's lock: a worker releasing its work can take it
        quiet = quiet + 1 if _busy_workers() == 0 else 0
        if quiet >= 2:
            return
