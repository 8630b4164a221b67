"""Probes on process-group setup and teardown: who this rank is, which backend, when it ended."""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpdoctor.rank import callsite, relaunch
from ddpdoctor.rank.probes import spawn as spawn_probe
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import DestroyProcessGroup, InitProcessGroup

PROBE = "lifecycle"


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
            if not args and kwargs.get("group") is None:
                with rec.guard(PROBE, "destroy_process_group"):
                    rec.emit(DestroyProcessGroup(site=callsite.caller_site()))
                    rec.clock.detach()
            return original(*args, **kwargs)

        return destroy_process_group

    # A hung rank books what it issued (the gradient all-reduce it waits in) before its stack is read.
    rec.on_dump.insert(0, rec.clock.sync)
    for owner in (dist, c10d):
        patch(rec, PROBE, owner, "init_process_group", wrap_init)
        patch(rec, PROBE, owner, "destroy_process_group", wrap_destroy)
