"""Facts of the process group and the job's DDP modules."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import DDPRewrap, DDPUsage, DDPWrap, InitProcessGroup

__all__ = ["has_process_group", "wraps", "framework", "usage", "canonical"]


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
