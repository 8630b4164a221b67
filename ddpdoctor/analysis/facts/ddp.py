"""Facts of the process group and the job's DDP modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import DDPRewrap, DDPUsage, DDPWrap, InitProcessGroup, ShardedWrap

__all__ = ["has_process_group", "wraps", "framework", "usage", "canonical", "Sharding", "sharding",
           "sharded_without_ddp", "replicate_groups"]


@derived
def has_process_group(evidence: Evidence) -> bool:
    return evidence.any(InitProcessGroup)


@derived
def wraps(evidence: Evidence) -> dict[int, dict[int, DDPWrap]]:
    """DDP module index -> rank -> its wrap event."""
    out: dict[int, dict[int, DDPWrap]] = {}
    for rank, event in evidence.events(DDPWrap):
        out.setdefault(event.ddp, {})[rank] = event
    return out


@derived
def framework(evidence: Evidence) -> Optional[tuple[str, Optional[str]]]:
    """(framework, version) that built the job's DDP modules ("accelerate", "lightning" for the
    Trainer, "fabric"), None for DDP built by hand."""
    for _, per_rank in sorted(wraps(evidence).items()):
        for _, wrap in sorted(per_rank.items()):
            if wrap.framework:
                return wrap.framework, wrap.framework_version
    return None


@derived
def usage(evidence: Evidence) -> dict[int, dict[int, DDPUsage]]:
    """DDP module index -> rank -> the usage totals with the most iterations."""
    out: dict[int, dict[int, DDPUsage]] = {}
    for rank, event in evidence.events(DDPUsage):
        current = out.setdefault(event.ddp, {}).get(rank)
        if current is None or event.iterations >= current.iterations:
            out[event.ddp][rank] = event
    return out


@derived
def canonical(evidence: Evidence) -> dict[int, int]:
    """DDP module index -> the first DDP module wrapping the same module (itself when not rewrapped)."""
    out: dict[int, int] = {}
    for _, event in evidence.events(DDPRewrap):
        out[event.ddp] = out.get(event.previous, event.previous)
    return out


_API_NAMES = {"fully_shard": "FSDP2", "FullyShardedDataParallel": "FSDP1", "replicate": "replicate()",
              "replicate_with_fsdp": "replicate() (FSDP2-based)"}


_SHARDING_APIS = ("fully_shard", "FullyShardedDataParallel")  # the APIs that give each rank a shard


@dataclass(frozen=True)
class Sharding:
    """How the job's model is sharded or replicated by an API other than the DDP class, as its
    first recorded call (``ShardedWrap``) says."""

    api: str  # the call: "fully_shard", "FullyShardedDataParallel", "replicate", "replicate_with_fsdp"
    mesh_shape: tuple[int, ...]
    mesh_dims: tuple[str, ...]
    hybrid: bool

    @property
    def name(self) -> str:
        """"FSDP2", "HSDP (FSDP2)", "FSDP1", "HSDP (FSDP1)", "replicate()"."""
        base = _API_NAMES.get(self.api, self.api)
        return f"HSDP ({base})" if self.hybrid and base in ("FSDP2", "FSDP1") else base

    @property
    def shards_parameters(self) -> bool:
        """Whether each rank holds a shard of the parameters (replicate() keeps whole replicas)."""
        return self.api in _SHARDING_APIS

    def describe(self) -> str:
        """E.g. "FSDP2 on a 1-D mesh of 2", "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)"."""
        if not self.mesh_shape:
            return self.name
        if len(self.mesh_shape) == 1:
            named = f" ({self.mesh_dims[0]})" if self.mesh_dims and self.mesh_dims[0] else ""
            return f"{self.name} on a 1-D mesh of {self.mesh_shape[0]}{named}"
        shape = "x".join(str(n) for n in self.mesh_shape)
        dims = " x ".join(self.mesh_dims) if all(self.mesh_dims) else ""
        if not dims and self.hybrid and len(self.mesh_shape) == 2:
            dims = "replicate x shard"
        return f"{self.name} on a {shape} mesh" + (f" ({dims})" if dims else "")


@derived
def sharding(evidence: Evidence) -> Optional[Sharding]:
    """The job's sharding, from the first rank's first recorded call; None when none was made."""
    for _, event in evidence.events(ShardedWrap):  # rank by rank: the lowest rank's first call
        return Sharding(api=event.api, mesh_shape=tuple(event.mesh_shape), mesh_dims=tuple(event.mesh_dims),
                        hybrid=event.hybrid)
    return None


@derived
def sharded_without_ddp(evidence: Evidence) -> Optional[Sharding]:
    """The job's sharding when it shards parameters and no model is wrapped in DDP: then there are no
    DDP replicas to compare, and the checks that compare them say so."""
    found = sharding(evidence)
    if found is None or not found.shards_parameters or wraps(evidence):
        return None
    return found


@derived
def replicate_groups(evidence: Evidence) -> Optional[list[list[int]]]:
    """The groups of ranks that hold the same shard of a sharded model (HSDP's peers along the
    replicate dimension; one rank each under pure FSDP), as every rank's first sharding call
    recorded them, in rank order; None when a rank recorded none (older evidence, replicate())."""
    groups: set[tuple[int, ...]] = set()
    for rank in sorted(evidence.ranks):
        first = next((e for e in evidence.ranks[rank].of(ShardedWrap) if e.api in _SHARDING_APIS), None)
        if first is None or not first.replicate_group:
            return None
        groups.add(tuple(sorted(first.replicate_group)))
    return sorted(list(g) for g in groups) or None
