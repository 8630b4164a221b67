"""Finds the user's own code in a Python stack, skipping torch, ddpdoctor and the standard library."""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType
from typing import Optional

# realpath: a venv reaches site-packages through both lib/ and the lib64/ symlink.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_FIXTURES_DIR = os.path.join(_PKG_DIR, "fixtures")


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    prefixes = {paths.get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    # Where torch is, without importing it: the watchdog thread walks stacks before the script has
    # imported torch, and the rank's probes install on the script's own import (probes/__init__.py).
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is not None and spec.origin:
        prefixes.add(os.path.dirname(os.path.abspath(spec.origin)))
    return tuple(sorted(os.path.realpath(p) + os.sep for p in prefixes if p))


_LIBRARY_PREFIXES: Optional[tuple[str, ...]] = None


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True for the script's own files (the bundled fixtures count as user code)."""
    global _LIBRARY_PREFIXES
    if not filename or filename.startswith("<"):
        return False
    filename = os.path.realpath(filename)
    if filename.startswith(_FIXTURES_DIR + os.sep):
        return True
    if filename.startswith(_PKG_DIR + os.sep):
        return False
    if _LIBRARY_PREFIXES is None:
        _LIBRARY_PREFIXES = _library_prefixes()
    return not filename.startswith(_LIBRARY_PREFIXES)


def user_frames(frame: Optional[FrameType], limit: int = 3) -> list[dict]:
    """Innermost-first user frames as {file, line, function}, walking outwards from ``frame``."""
    out: list[dict] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if is_user_file(code.co_filename):
            out.append({"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name})
        frame = frame.f_back
    return out


def caller_site(limit: int = 1) -> list[dict]:
    """User frames of the current call stack (innermost first)."""
    return user_frames(sys._getframe(1), limit)


def format_stack(frame: Optional[FrameType], limit: int = 30) -> list[dict]:
    """The whole stack of ``frame`` outermost-first, for hang and crash reports."""
    entries = traceback.extract_stack(frame, limit=limit)
    return [
        {"file": e.filename, "line": e.lineno, "function": e.name, "code": (e.line or "").strip(),
         "user": is_user_file(e.filename)}
        for e in entries
    ]


def traceback_user_frames(tb: Optional[TracebackType], limit: int = 8) -> list[dict]:
    """Frames of an exception's traceback, outermost-first, marked user or library."""
    entries = traceback.extract_tb(tb)[-limit:]
    return [
        {"file": e.filename, "line": e.lineno, "function": e.name, "code": (e.line or "").strip(),
         "user": is_user_file(e.filename)}
        for e in entries
    ]
