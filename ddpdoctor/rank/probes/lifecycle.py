"""Probes on process-group setup and teardown: who this rank is, which backend, when it ended."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpdoctor.rank import callsite, relaunch
from ddpdoctor.rank.probes import spawn as spawn_probe
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import DestroyProcessGroup, InitProcessGroup

PROBE = "lifecycle"
RELEASE_WAIT_S = 0.05


def _let_backend_threads_release_work() -> None:
    """Release the GIL for a moment after the default group is destroyed, while a torch function
    mode is on the stack (the device simulation's, or the script's own).

    Each collective's work object keeps the thread-local state it was launched with, and so that
    mode, a Python object. The last reference to a finished work is often the gloo worker thread's,
    which drops it just after the caller's wait returned, and needs the GIL to release the mode.
    When DDP's Reducer is freed soon after (the script's ``main`` returning), its process group's
    destructor joins those threads while holding the GIL: a deadlock at the script's end (seen on
    2 cores in 2 runs of 5 of fixtures/gpu_transformers.py, the ranks stuck in
    ``~ProcessGroupGloo``, a worker in ``~AsyncAllreduceWork`` waiting for the GIL)."""
    time.sleep(RELEASE_WAIT_S)


def install(rec: Recorder) -> None:
    def wrap_init(original):
        def init_process_group(*args, **kwargs):
            if relaunch.expects_torchrun(args, kwargs, spawned=spawn_probe.spawned()):
                relaunch.ask(rec.evidence_dir, callsite.caller_site())
            result = original(*args, **kwargs)
            with rec.guard(PROBE, "init_process_group"):
                rec.rank = dist.get_rank()
                rec.world_size = dist.get_world_size()
                rec.clock.attach(c10d._get_default_group())
                rec.emit(InitProcessGroup(backend=str(dist.get_backend()), world_size=rec.world_size,
                                          numbering=rec.clock.numbering,
                                          local_rank=rec.local_rank, node_rank=rec.node_rank, host=rec.host,
                                          pid=rec.pid, site=callsite.caller_site()))
            return result

        return init_process_group

    def wrap_destroy(original):
        def destroy_process_group(*args, **kwargs):
            default = not args and kwargs.get("group") is None
            if default:
                with rec.guard(PROBE, "destroy_process_group"):
                    rec.emit(DestroyProcessGroup(site=callsite.caller_site()))
                    rec.clock.detach()
            result = original(*args, **kwargs)
            if default and torch._C._len_torch_function_stack():
                _let_backend_threads_release_work()
            return result

        return destroy_process_group

    # A hung rank books what it issued (the gradient all-reduce it waits in) before its stack is read.
    rec.on_dump.insert(0, rec.clock.sync)
    for owner in (dist, c10d):
        patch(rec, PROBE, owner, "init_process_group", wrap_init)
        patch(rec, PROBE, owner, "destroy_process_group", wrap_destroy)
