"""Facts of the optimizer steps: their fingerprints, and how each optimizer was described."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from ddpdoctor.analysis.compare import group_by_value
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import OptimizerInfo, ProcessStart, Step
from ddpdoctor.schema.fingerprints import Fingerprint, decode_fingerprints

__all__ = ["Divergence", "Sampled", "fingerprint_every", "optimizer_info", "sampled", "divergence", "divergence_within"]


@dataclass(frozen=True)
class Divergence:
    """The first fingerprinted (step, parameter) at which replicas differ."""

    step: int
    optimizer: int
    index: int
    kind: str  # "grads" or "params"
    groups: list[list[int]]
    values: dict[int, Fingerprint]
    events: dict[int, Step]  # rank -> Step
    last_identical_step: Optional[int] = None


class Sampled(NamedTuple):
    """The steps with fingerprints or a configuration digest."""

    steps: dict[tuple[int, int], dict[int, Step]]  # (optimizer step, optimizer) -> rank -> its Step, in step order
    without_grads: bool  # some of them have no gradient fingerprints
    without_config: bool  # some of them have no configuration digest


@derived
def fingerprint_every(evidence: Evidence) -> int:
    return max((e.fingerprint_every for _, e in evidence.events(ProcessStart)), default=1)


def optimizer_info(evidence: Evidence, rank: int, opt: int, n: Optional[int] = None) -> Optional[OptimizerInfo]:
    """How optimizer ``opt`` of ``rank`` was described at its step ``n`` (None: its first description)."""
    ev = evidence.ranks.get(rank)
    if not ev:
        return None
    found = None
    for info in ev.of(OptimizerInfo):
        if info.opt == opt and (found is None or (n is not None and found.n < info.n <= n)):
            found = info
    return found


@derived
def sampled(evidence: Evidence) -> Sampled:
    """(optimizer step, optimizer) -> rank -> its Step, for steps with fingerprints or a config
    digest, in step order; and whether some of them lack the fingerprints, or the digest."""
    by_step: dict[tuple[int, int], dict[int, Step]] = {}
    without_grads = without_config = False
    for rank, event in evidence.events(Step):
        if event.grads is not None or event.config is not None:
            by_step.setdefault((event.n, event.opt), {})[rank] = event
            without_grads = without_grads or event.grads is None
            without_config = without_config or event.config is None
    return Sampled(dict(sorted(by_step.items())), without_grads, without_config)


@derived
def divergence(evidence: Evidence) -> tuple[Optional[Divergence], int]:
    """The first (step, parameter) whose fingerprints differ across ranks, and how many steps compared."""
    return divergence_within(evidence, None)


def divergence_within(evidence: Evidence, groups: Optional[list[list[int]]]
                      ) -> tuple[Optional[Divergence], int]:
    """The first (step, parameter) whose fingerprints differ among the ranks of one of ``groups``
    (None: all ranks, one group), and how many steps compared (a step with two ranks of a group)."""
    num_compared = 0
    last_identical: dict[int, int] = {}
    steps, without_grads, _ = sampled(evidence)
    for (n, opt), per_rank in steps.items():
        events = {r: e for r, e in per_rank.items() if e.grads is not None} if without_grads else per_rank
        among = [events] if groups is None else [{r: events[r] for r in g if r in events} for g in groups]
        among = [group for group in among if len(group) >= 2]
        if not among:
            continue
        num_compared += 1
        for kind in ("grads", "params"):
            for group in among:
                found = _first_difference(group, kind)
                if found is not None:
                    index, values, value_groups = found
                    return (Divergence(n, opt, index, kind, value_groups, values, group, last_identical.get(opt)),
                            num_compared)
        last_identical[opt] = n
    return None, num_compared


def _first_difference(events: dict[int, Step], kind: str
                      ) -> Optional[tuple[int, dict[int, Fingerprint], list[list[int]]]]:
    """(parameter index, each rank's fingerprint, the ranks grouped by it) of the first parameter whose
    ``kind`` fingerprints differ among ``events``; None when all agree."""
    reference = getattr(events[min(events)], kind)
    if all(getattr(e, kind) == reference for e in events.values()):
        return None  # bit-identical replicas, the common case: one string comparison per rank
    decoded = {r: decode_fingerprints(getattr(e, kind) or "") for r, e in events.items()}
    length = min(len(d) for d in decoded.values())
    for i in range(length):
        values = {r: d[i] for r, d in decoded.items()}
        groups = group_by_value(values)
        if len(groups) > 1:
            return i, values, groups
    return None
