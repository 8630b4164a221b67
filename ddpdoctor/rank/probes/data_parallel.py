"""Probe on single-process ``nn.DataParallel``: where a model was wrapped in it, and over which
devices. Under torchrun each process that does so trains its own copy over the GPUs it sees, and
nothing averages the copies across processes; not-distributed names the wrap as the root."""

from __future__ import annotations

from torch.nn.parallel import DataParallel

from ddpdoctor.rank import callsite
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import DataParallelWrap

PROBE = "data_parallel"


def install(rec: Recorder) -> None:
    """Patch ``DataParallel.__init__`` (the class, so every import path sees it)."""
    seen: set[tuple[str, int]] = set()  # call sites already recorded: a wrap in a loop is written once

    def wrap_init(original):
        def __init__(self, module, *args, **kwargs):
            original(self, module, *args, **kwargs)
            with rec.guard(PROBE, "DataParallel.__init__"):
                site = callsite.caller_site()
                where = (site[0]["file"], site[0]["line"]) if site else ("", 0)
                if where not in seen:
                    seen.add(where)
                    rec.emit(DataParallelWrap(module=type(module).__name__, site=site,
                                              device_ids=[int(i) for i in (self.device_ids or [])]))

        return __init__

    patch(rec, PROBE, DataParallel, "__init__", wrap_init)
