"""Facts of the world group's collectives, compared rank by rank."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.analysis.collective_trace import Mismatch, RankTrace, first_mismatch, trace_of
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import Collective, InitProcessGroup, InternalCollectives

__all__ = ["world_traces", "divergence"]


@derived
def world_traces(evidence: Evidence) -> dict[int, RankTrace]:
    """Each rank's numbered world-group collectives, DDP's own included (point-to-point and
    subgroups left out)."""
    missing = set(evidence.observations.missing_ranks)  # no trace at all (a rank that left no dump)
    traces = {}
    for rank, ev in evidence.ranks.items():
        if rank in missing:
            continue
        init = ev.first(InitProcessGroup)
        traces[rank] = trace_of(ev.of(Collective), ev.of(InternalCollectives), init.numbering if init else "calls")
    return traces


@derived
def divergence(evidence: Evidence) -> Optional[Mismatch]:
    """The first number at which ranks issued different collectives or shapes, counting a
    collective some ranks never issued as a difference."""
    return first_mismatch(world_traces(evidence), include_missing=True)
