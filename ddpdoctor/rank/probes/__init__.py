"""In-rank probes. ``install`` hooks torch before the user's script runs; nothing here changes
what the script computes, and a probe that fails is recorded, never raised into the script."""

from __future__ import annotations

import importlib
from typing import Callable

from ddpdoctor.rank.probes import patching
from ddpdoctor.rank.recorder import Recorder

# Each module's install(rec) returns an optional finalizer run when the script ends.
PROBE_MODULES = ("lifecycle", "ddp", "optimizer", "collectives", "data", "join", "spawn", "checkpoint")


def install(rec: Recorder) -> Callable[[], None]:
    """Install every probe; returns a finalizer that flushes state still open at exit, then
    removes the hooks and restores everything patched."""
    finalizers: list[tuple[str, Callable[[], None]]] = []
    for name in PROBE_MODULES:
        try:
            module = importlib.import_module(f"ddpdoctor.rank.probes.{name}")
            finalizer = module.install(rec)
        except Exception as exc:
            rec.probe_failed(name, exc, phase="install")
            continue
        if finalizer is not None:
            finalizers.append((name, finalizer))

    def finish() -> None:
        for name, finalizer in reversed(finalizers):
            try:
                finalizer()
            except Exception as exc:
                rec.probe_failed(name, exc, target="finish")
        patching.restore_all()

    return finish
