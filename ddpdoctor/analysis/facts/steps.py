"""Facts of the optimizer steps: their fingerprints, and how each optimizer was described."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from ddpdoctor.analysis.compare import group_by_value
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.schema.events import OptimizerInfo, ProcessStart, Step
from ddpdoctor.schema.fingerprints import Fingerprint, decode_fingerprints

__all__ = ["Divergence", "Sampled", "fingerprint_every", "optimizer_info", "sampled", "divergence"]


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
    num_compared = 0
    last_identical: dict[int, int] = {}
    steps, without_grads, _ = sampled(evidence)
    for (n, opt), per_rank in steps.items():
        events = {r: e for r, e in per_rank.items() if e.grads is not None} if without_grads else per_rank
        if len(events) < 2:
            continue
        num_compared += 1
        for kind in ("grads", "params"):
            reference = getattr(events[min(events)], kind)
            if all(getattr(e, kind) == reference for e in events.values()):
                continue  # bit-identical replicas, the common case: one string comparison per rank
            decoded = {r: decode_fingerprints(getattr(e, kind) or "") for r, e in events.items()}
            length = min(len(d) for d in decoded.values())
            for i in range(length):
                values = {r: d[i] for r, d in decoded.items()}
                groups = group_by_value(values)
                if len(groups) > 1:
                    return Divergence(n, opt, i, kind, groups, values, events, last_identical.get(opt)), num_compared
        last_identical[opt] = n
    return None, num_compared
