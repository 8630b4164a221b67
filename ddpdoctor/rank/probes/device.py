"""The device simulation probe: installed first, so the other probes wrap its stand-ins and record
the script's own arguments (see ddpdoctor.rank.devicesim)."""

from __future__ import annotations

from typing import Callable

from ddpdoctor.rank import devicesim
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import RankSettings


def install(rec: Recorder) -> Callable[[], None]:
    settings = RankSettings.from_env()
    return devicesim.install(rec, mode=settings.device, nproc_per_node=settings.nproc_per_node)
