"""Process-tree bookkeeping on Linux: find every descendant, stop them all, leave nothing behind."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Optional


def _stat(pid: int) -> Optional[tuple[int, int, str]]:
    """(parent pid, start time, state) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19]), fields[0]


def start_time(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot): with the pid, names one process for good."""
    info = _stat(pid)
    return info[1] if info else None


def _children(pid: int) -> Optional[list[int]]:
    """The children of every thread of ``pid`` (None where the kernel has no children files)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(child) for child in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended meanwhile
            return None  # no CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return found


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of ``root``: a walk down the tree through the
    kernel's children files (cheap: every rank's supervisor does it every few seconds), or a scan
    of every process where those files do not exist."""
    found: dict[int, int] = {}
    stack = [root]
    while stack:
        children = _children(stack.pop())
        if children is None:
            return _scan_descendants(root)
        for child in children:
            start = start_time(child)
            if start is not None and child not in found:
                found[child] = start
                stack.append(child)
    return found


def _scan_descendants(root: int) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = _stat(int(entry))
        if info is None:
            continue
        children.setdefault(info[0], []).append(int(entry))
        starts[int(entry)] = info[1]
    found: dict[int, int] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found[child] = starts[child]
                stack.append(child)
    return found


def alive(pid: int, start_time: Optional[int] = None) -> bool:
    """Alive and not a zombie, and (when given) still the same process, not a recycled pid."""
    info = _stat(pid)
    if info is None or info[2] == "Z":
        return False
    return start_time is None or info[1] == start_time


def signal_all(pids: Iterable[tuple[int, Optional[int]]], sig: int) -> None:
    for pid, start in pids:
        if alive(pid, start):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop_all(pids: dict[int, Optional[int]], *, grace_s: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL whatever is left."""
    signal_all(pids.items(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p, s) for p, s in pids.items()):
        time.sleep(0.05)
    signal_all(pids.items(), signal.SIGKILL)
