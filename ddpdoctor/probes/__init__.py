"""In-rank probes. ``install`` hooks torch before the user's script runs; nothing here changes
what the script computes."""

from __future__ import annotations

from typing import Callable

from ddpdoctor.probes import patching
from ddpdoctor.recorder import Recorder


def install(rec: Recorder) -> Callable[[], None]:
    """Install every probe; returns a finalizer that flushes state still open at exit, then
    removes the hooks and restores everything patched."""
    from ddpdoctor.probes import checkpoint, collectives, data, ddp, join, lifecycle, optim, spawn

    lifecycle.install(rec)
    ddp.install(rec)
    hook_handles = optim.install(rec)
    collectives.install(rec)
    finish_passes = data.install(rec)
    join.install(rec)
    spawn.install()
    checkpoint.install(rec)

    def finish() -> None:
        finish_passes()
        for handle in hook_handles:
            handle.remove()
        patching.restore_all()

    return finish
