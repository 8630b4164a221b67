"""How code running inside a rank (the reference job's collective benchmark) hands evidence to
ddpdoctor: the environment probe registers this process's recorder here. Outside ddpdoctor there
is no recorder and ``emit`` is a no-op, so the same code runs under plain torchrun."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import Event

_recorder: Optional[Recorder] = None


def set_recorder(rec: Optional[Recorder]) -> None:
    global _recorder
    _recorder = rec


def emit(event: Event) -> bool:
    """Record ``event`` if this process runs under ddpdoctor; never raises into the caller."""
    if _recorder is None:
        return False
    try:
        _recorder.emit(event)
    except Exception:
        return False
    return True
