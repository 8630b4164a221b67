"""Tracebacks as the user's script would print them without ddpdoctor: our frames taken out.

The bootstrap, runpy and the probes' wrappers sit between Python's entry point and the user's
code; a user reading a rank's traceback should see only their script and the libraries it called.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType
from typing import Optional

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_FIXTURES_DIR = os.path.join(_PKG_DIR, "fixtures")
_RUNPY = ("runpy.py", "<frozen runpy>")


def _hidden(filename: str) -> bool:
    if filename.endswith(_RUNPY):
        return True
    path = os.path.realpath(filename) if not filename.startswith("<") else filename
    return path.startswith(_PKG_DIR + os.sep) and not path.startswith(_FIXTURES_DIR + os.sep)


def without_our_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The same traceback chain with ddpdoctor's and runpy's frames left out."""
    kept = []
    while tb is not None:
        if not _hidden(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt: Optional[TracebackType] = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def clean(exc: BaseException) -> BaseException:
    """Strip our frames from ``exc`` and every exception chained to it, in place."""
    seen: set[int] = set()
    todo: list[Optional[BaseException]] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = without_our_frames(current.__traceback__)
        todo += [current.__cause__, current.__context__]
    return exc


def print_exception(exc: BaseException) -> None:
    """Print like an uncaught exception (through sys.excepthook, which torch may have set)."""
    clean(exc)
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    sys.stderr.flush()


def format_exception(exc: BaseException) -> str:
    clean(exc)
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
