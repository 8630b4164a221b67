"""Keeps PyTorch's flight recorder dumps of a checked job (``--keep-evidence``), so a user can hold
the live diagnosis against ``ddpdoctor analyze`` of the same run.

Each rank writes ``fr_trace_rank_<rank>`` (torch's ``<prefix><rank>`` naming, the pickle
``_dump_fr_trace`` returns) into the evidence folder: when a hang is being reported (the
watchdog's dump request, from its own thread: the main thread is blocked in the collective), just
before ``destroy_process_group`` (a dump after it can race the backend's teardown), and at the end
if the script never destroyed its group. No collective, nothing written without --keep-evidence.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema import settings

PROBE = "flight-recorder-dump"
FILE_PREFIX = "fr_trace_rank_"


def dump_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{rank}")


def _write(rec: Recorder, *, settle: bool) -> None:
    if rec.rank is None:
        return
    c10d_bindings = getattr(torch._C, "_distributed_c10d", None)
    if c10d_bindings is None or not hasattr(c10d_bindings, "_dump_fr_trace"):
        return
    data = c10d_bindings._dump_fr_trace(True, True, False)
    if settle:  # gloo marks a collective completed a moment after it returns: let the last one settle
        for _ in range(10):
            if not _has_unretired(data):
                break
            time.sleep(0.02)
            data = c10d_bindings._dump_fr_trace(True, True, False)
    path = dump_path(rec.evidence_dir, rec.rank)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _has_unretired(data: bytes) -> bool:
    try:
        return any(not e.get("retired") for e in pickle.loads(data).get("entries", []))
    except Exception:
        return False


def install(rec: Recorder) -> Optional[Callable[[], None]]:
    if not settings.RankSettings.from_env().flight_recorder_dumps:
        return None
    state = {"destroyed": False}

    def on_hang() -> None:
        with rec.guard(PROBE, "dump on hang"):
            _write(rec, settle=False)

    def wrap_destroy(original):
        def destroy_process_group(*args, **kwargs):
            if not args and kwargs.get("group") is None and dist.is_initialized():
                with rec.guard(PROBE, "dump at the end"):
                    _write(rec, settle=True)
                state["destroyed"] = True
            return original(*args, **kwargs)

        return destroy_process_group

    for owner in (dist, c10d):
        patch(rec, PROBE, owner, "destroy_process_group", wrap_destroy)
    rec.on_dump.append(on_hang)

    def finish() -> None:
        if not state["destroyed"] and dist.is_initialized():
            with rec.guard(PROBE, "dump at the end"):
                _write(rec, settle=True)

    return finish
