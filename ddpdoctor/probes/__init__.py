"""In-rank probes. ``install`` hooks torch before the user's script runs; nothing here changes
what the script computes."""

from __future__ import annotations

from typing import Callable

from ddpdoctor.recorder import Recorder


def install(rec: Recorder) -> Callable[[], None]:
    """Install every probe; returns a finalizer that flushes state still open at exit."""
    from ddpdoctor.probes import collectives, data, ddp, join, lifecycle, optim, spawn

    lifecycle.install(rec)
    ddp.install(rec)
    optim.install(rec)
    collectives.install(rec)
    finish_passes = data.install(rec)
    join.install(rec)
    spawn.install()
    try:
        from ddpdoctor.probes import checkpoint

        checkpoint.install(rec)
    except ImportError:
        pass
    return finish_passes
