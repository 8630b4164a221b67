"""Probe on torch.distributed.algorithms.join.Join: the correct tool for uneven inputs."""

from __future__ import annotations

from torch.distributed.algorithms.join import Join

from ddpdoctor.rank import callsite
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import JoinEvent

PROBE = "join"


def install(rec: Recorder) -> None:
    def wrap_enter(original):
        def __enter__(self):
            with rec.guard(PROBE, "Join.__enter__"):
                rec.emit(JoinEvent(phase="enter", site=callsite.caller_site()))
            return original(self)

        return __enter__

    def wrap_exit(original):
        def __exit__(self, *exc):
            result = original(self, *exc)
            with rec.guard(PROBE, "Join.__exit__"):
                rec.emit(JoinEvent(phase="exit"))
            return result

        return __exit__

    patch(rec, PROBE, Join, "__enter__", wrap_enter)
    patch(rec, PROBE, Join, "__exit__", wrap_exit)
