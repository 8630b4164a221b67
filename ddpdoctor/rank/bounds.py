"""Bounded runs: stop the user's script cleanly after N optimizer steps or N training epochs.

Every rank stops at the same boundary (the same optimizer step, or the start of the same pass over
the training loader), so no rank is left waiting in a collective. The stop is an exception derived
from BaseException, like SystemExit, so the script's `except Exception` handlers let it through
while its `finally` blocks and context managers still run; the bootstrap turns it into a clean exit.
"""

from __future__ import annotations

from ddpdoctor.rank.recorder import Recorder


class RunCut(BaseException):
    """Raised into the script at the boundary where ddpdoctor stops it on purpose."""

    def __init__(self, reason: str, at: int) -> None:
        super().__init__(f"ddpdoctor stopped the script on purpose: {reason} {at}")
        self.reason = reason
        self.at = at


def after_step(rec: Recorder) -> None:
    """Called after every recorded optimizer step."""
    if rec.max_steps is not None and rec.num_steps >= rec.max_steps:
        raise RunCut("max-steps", rec.num_steps)


def before_pass(rec: Recorder, training_passes_done: int) -> None:
    """Called when a loader that already fed training starts another pass."""
    if rec.max_epochs is not None and training_passes_done >= rec.max_epochs:
        raise RunCut("max-epochs", training_passes_done)
