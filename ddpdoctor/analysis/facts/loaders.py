"""Facts of the loader passes: each rank's parts merged, and passes numbered as paired across ranks."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.analysis.passes import pair, role
from ddpdoctor.schema.events import ContentPass, LoaderPass
from ddpdoctor.schema.indices import merge_encoded

__all__ = ["merge_parts", "pass_numbers", "passes"]


def merge_parts(parts: list[LoaderPass]) -> LoaderPass:
    """One pass from the parts a rank wrote: indices of every part, counters of the last."""
    parts = sorted(parts, key=lambda p: p.part)
    last = parts[-1]
    if len(parts) == 1:
        return last
    encoded = [p.indices for p in parts if p.indices is not None]
    opaque = len(encoded) < len(parts)
    indices = None if opaque else merge_encoded(encoded)
    return dataclasses.replace(last, part=0, indices=indices, head=parts[0].head,
                               num_samples=None if opaque else sum(p.num_samples or 0 for p in parts))


@derived
def _merged_passes(evidence: Evidence) -> dict[tuple[int, str, int], LoaderPass]:
    """(rank, loader, raw pass number) -> the whole pass, its parts merged."""
    parts: dict[tuple[int, str, int], list[LoaderPass]] = {}
    for rank, event in evidence.events(LoaderPass):
        parts.setdefault((rank, event.loader, event.number), []).append(event)
    return {key: merge_parts(pieces) for key, pieces in parts.items()}


@derived
def pass_numbers(evidence: Evidence) -> dict[tuple[int, str, int], int]:
    """(rank, loader, raw pass number) -> the pass's number as paired across ranks
    (:mod:`ddpdoctor.analysis.passes`), for index passes and content passes alike."""
    kinds: dict[tuple[int, str, int], tuple[str, Optional[int]]] = {}
    for rank, content_pass in evidence.events(ContentPass):
        if content_pass.source == "loader":
            kinds[(rank, content_pass.key, content_pass.number)] = (
                role(fed=bool(content_pass.steps or content_pass.ddp_forwards), complete=content_pass.complete),
                content_pass.epoch)
    for (rank, loader, number), event in _merged_passes(evidence).items():  # the index probe's counters win
        kinds[(rank, loader, number)] = (
            role(fed=bool(event.steps or event.ddp_forwards), complete=event.complete), event.sampler.epoch)
    return pair((rank, key, number, kind, epoch) for (rank, key, number), (kind, epoch) in kinds.items())


@derived
def passes(evidence: Evidence) -> dict[tuple[str, int], dict[int, LoaderPass]]:
    """(loader, pass number as paired across ranks) -> rank -> the whole pass, its parts merged."""
    numbers = pass_numbers(evidence)
    out: dict[tuple[str, int], dict[int, LoaderPass]] = {}
    for (rank, loader, number), event in _merged_passes(evidence).items():
        out.setdefault((loader, numbers[(rank, loader, number)]), {})[rank] = event
    return out
