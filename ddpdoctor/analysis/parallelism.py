"""What data parallelism the job used, as the report states it (``Report.parallelism``): the wrapper
(DDP, FSDP2, HSDP, FSDP1, ``replicate()``), the mesh it spans, which of its dimensions replicates
and which shards, the groups of ranks that hold the same replica, and an optimizer that shards its
state (ZeroRedundancyOptimizer). Derived from the wrap events the probes recorded; None for a job
that wrapped nothing.
"""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts import ddp
from ddpdoctor.schema.events import DDPWrap, OptimizerInfo, ShardedWrap
from ddpdoctor.schema.findings import Location

__all__ = ["parallelism", "STATE_SHARDING_OPTIMIZERS"]

# Optimizers that shard their own state across the ranks (ZeRO stage 1) beside a replicated model.
STATE_SHARDING_OPTIMIZERS = ("ZeroRedundancyOptimizer",)


def _first_site(site: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    location = Location.from_site(site)
    return location.to_json() if location is not None else None


def _state_sharding(evidence: Evidence) -> Optional[str]:
    return next((e.type_name for _, e in evidence.events(OptimizerInfo)
                 if e.type_name in STATE_SHARDING_OPTIMIZERS), None)


def _ddp_groups(evidence: Evidence) -> list[list[int]]:
    """The distinct process groups of the first DDP module's ranks (each rank's as it recorded it)."""
    groups: set[tuple[int, ...]] = set()
    for _, event in evidence.events(DDPWrap):
        if event.ddp == 0 and event.group_ranks:
            groups.add(tuple(sorted(event.group_ranks)))
    return sorted(list(g) for g in groups)


def parallelism(evidence: Evidence) -> Optional[dict[str, Any]]:
    """``{wrapper, api, description, mesh_shape, mesh_dims, replicate_dim, shard_dim, replicate_groups,
    optimizer_sharding, location}``; None when no model was wrapped for data parallelism."""
    optimizer = _state_sharding(evidence)
    sharding = ddp.sharding(evidence)
    if sharding is not None and (sharding.shards_parameters or not ddp.wraps(evidence)):
        first = next(e for _, e in evidence.events(ShardedWrap))
        shape, dims = list(sharding.mesh_shape), list(sharding.mesh_dims)
        if sharding.shards_parameters:
            replicate_dim = 0 if sharding.hybrid and len(shape) >= 2 else None
            shard_dim = len(shape) - 1 if shape else None
        else:  # replicate(): every rank holds the whole model
            replicate_dim, shard_dim = (0 if shape else None), None
        return {"wrapper": sharding.name, "api": sharding.api, "description": sharding.describe(),
                "mesh_shape": shape, "mesh_dims": dims, "replicate_dim": replicate_dim, "shard_dim": shard_dim,
                "replicate_groups": ddp.replicate_groups(evidence), "optimizer_sharding": optimizer,
                "location": _first_site(first.site)}
    first_wrap = next((e for _, e in evidence.events(DDPWrap)), None)
    if first_wrap is None:
        return None
    groups = _ddp_groups(evidence)
    world = evidence.world_size
    size = len(groups[0]) if groups else world
    if groups and size < world:
        described = ", ".join("(" + ", ".join(map(str, g)) + ")" for g in groups)
        description = f"DDP over groups of {size} of the {world} ranks: {described}"
    else:
        description = f"DDP over {size} rank{'s' if size != 1 else ''}"
    if optimizer:
        description += f", optimizer state sharded by {optimizer}"
    return {"wrapper": "DDP", "api": "DistributedDataParallel", "description": description,
            "mesh_shape": [size], "mesh_dims": [""], "replicate_dim": 0, "shard_dim": None,
            "replicate_groups": groups or None, "optimizer_sharding": optimizer,
            "location": _first_site(first_wrap.site)}
