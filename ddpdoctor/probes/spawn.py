"""Probes for scripts that start their own workers with torch.multiprocessing.spawn/start_processes.

The worker function is wrapped in a picklable object that installs the probes in the child before
calling it; settings reach the child through the inherited environment.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ddpdoctor.probes.patching import patch


class ProbedWorker:
    """Picklable stand-in for the user's worker function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        from ddpdoctor import bootstrap

        return bootstrap.run_probed(self.fn, *args)


def install() -> None:
    import torch.multiprocessing as mp

    spawn_module = sys.modules["torch.multiprocessing.spawn"]

    def wrap(original):
        def start_processes(fn, *args, **kwargs):
            if not isinstance(fn, ProbedWorker):
                fn = ProbedWorker(fn)
            return original(fn, *args, **kwargs)

        return start_processes

    patch(spawn_module, "start_processes", wrap)
    patch(mp, "start_processes", lambda _original: spawn_module.start_processes)
