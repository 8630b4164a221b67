"""Probes for scripts that start their own workers with torch.multiprocessing.spawn/start_processes.

The worker function is wrapped in a picklable object that installs the probes in the child before
calling it; settings reach the child through the inherited environment.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Callable

from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder

PROBE = "spawn"


class _Spawned:
    """Whether this process started workers or is one (a launcher that spawned nothing yet reads neither)."""

    value = False


def spawned() -> bool:
    return _Spawned.value


class ProbedWorker:
    """Picklable stand-in for the user's worker function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        from ddpdoctor.rank import bootstrap, tracebacks

        _Spawned.value = True

        def target() -> Any:
            from ddpdoctor.rank.probes import patching

            # This child re-imported the script before its probes were installed: rebind its imports.
            namespace = getattr(self.fn, "__globals__", None)
            if isinstance(namespace, dict):
                patching.rebind(namespace)
            return self.fn(*args)

        try:
            return bootstrap.run_recorded(target)
        except Exception as exc:
            # torch's worker wrapper (_wrap) sends format_exc() to the parent: hand it the user's
            # traceback without our frames, through the same error file, then exit as it would.
            error_file = sys._getframe(1).f_locals.get("error_file")
            if not isinstance(error_file, str):
                raise
            with open(error_file, "wb") as fh:
                pickle.dump(tracebacks.format_exception(exc), fh)
            sys.exit(1)


def install(rec: Recorder) -> None:
    import torch.multiprocessing as mp

    spawn_module = sys.modules["torch.multiprocessing.spawn"]

    def wrap(original):
        def start_processes(fn, *args, **kwargs):
            _Spawned.value = True
            if not isinstance(fn, ProbedWorker):
                fn = ProbedWorker(fn)
            return original(fn, *args, **kwargs)

        return start_processes

    patch(rec, PROBE, spawn_module, "start_processes", wrap)
    patch(rec, PROBE, mp, "start_processes", lambda _original: spawn_module.start_processes)
