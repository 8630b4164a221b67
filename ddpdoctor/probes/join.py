"""Probe on torch.distributed.algorithms.join.Join: the correct tool for uneven inputs."""

from __future__ import annotations

from torch.distributed.algorithms.join import Join

from ddpdoctor import callsite
from ddpdoctor.probes.patching import patch
from ddpdoctor.recorder import Recorder


def install(rec: Recorder) -> None:
    def wrap_enter(original):
        def __enter__(self):
            rec.emit("join", phase="enter", site=callsite.caller_site())
            return original(self)

        return __enter__

    def wrap_exit(original):
        def __exit__(self, *exc):
            result = original(self, *exc)
            rec.emit("join", phase="exit")
            return result

        return __exit__

    patch(Join, "__enter__", wrap_enter)
    patch(Join, "__exit__", wrap_exit)
