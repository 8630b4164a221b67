"""Judging --against-one-rank's replay: where N ranks and one process differ beyond rounding.

Each compared step starts from the same weights on the same global batch, so the two gradients are
the same sums taken in another order (per rank, then DDP's average, against one pass over the whole
batch) and differ only by rounding, unless the job weighs the batch differently. The tolerance is the
probabilistic rounding-error bound of Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019), the one
TTrace derives its thresholds from: a sum of n terms computed in precision u is off by at most
λ·√n·u (relative), with probability at least 1 - 2·exp(-λ²/2). n is the longest chain of roundings
of the step taken as one sum, the global batch's largest tensor times the widest layer's fan-in, an
overestimate that only widens the tolerance. A precision too coarse for any bound (bfloat16 on a
large batch) is said, not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.schema.observations import OneRankReplay

__all__ = ["LAMBDA", "UNIT_ROUNDOFF", "Difference", "Judgement", "tolerance", "judge"]

LAMBDA = 6.0  # 1 - 2·exp(-18): a bound that holds but for one sum in 30 million
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
USELESS = 0.1  # a tolerance above 10% would hide the differences the replay is for


@dataclass(frozen=True)
class Difference:
    """The first step where N ranks and one process differ beyond the tolerance."""

    step: int
    what: str  # "gradient" or "loss"
    parameter: Optional[str]  # the parameter whose gradient is furthest off, relative to the tolerance
    distance: float  # relative: |N - 1| / |1|
    loss_ranks: Optional[float]
    loss_one: Optional[float]
    scale: Optional[float]  # the N-rank gradient is this times one process's (where a single factor explains it)


@dataclass(frozen=True)
class Judgement:
    tolerance: Optional[float]  # None: no meaningful bound at this precision
    steps: int  # steps compared
    largest: float  # the largest relative gradient distance over every compared step
    parameters: int  # gradients compared per step (the most at any step)
    difference: Optional[Difference]
    limits: list[str] = field(default_factory=list)


def tolerance(replay: OneRankReplay) -> Optional[float]:
    """λ·√n·u for the replay's precision and sums, None where it exceeds USELESS."""
    unit = UNIT_ROUNDOFF.get(replay.precision, UNIT_ROUNDOFF["float32"])
    n = max(1, replay.rows) * max(1, replay.fan_in)
    bound = LAMBDA * math.sqrt(n) * unit
    return bound if bound <= USELESS else None


def _relative(distance: float, reference: float) -> float:
    if reference > 0:
        return distance / reference
    return 0.0 if distance == 0 else math.inf


def _scale(params: list[list[Any]]) -> Optional[float]:
    """s where the N-rank gradient is s times one process's within rounding (over all parameters), else None."""
    dot = sum(p[4] for p in params)
    ones = sum(p[3] ** 2 for p in params)
    ranks = sum(p[2] ** 2 for p in params)
    if ones <= 0 or ranks <= 0:
        return None
    s = dot / ones
    residual = math.sqrt(max(0.0, ranks - dot * dot / ones)) / math.sqrt(ranks)
    return s if residual <= 1e-3 else None


def judge(replay: OneRankReplay) -> Judgement:
    """The first step, and parameter, where N ranks and one process differ beyond rounding."""
    tol = tolerance(replay)
    largest = 0.0
    parameters = max((len(step.get("params") or []) for step in replay.steps), default=0)
    for step in replay.steps:
        params = step.get("params") or []
        distances = [(_relative(p[1], p[3]), p[0]) for p in params]
        worst = max(distances, default=(0.0, None))
        largest = max(largest, worst[0])
        if tol is None or replay.limits:
            continue
        loss_ranks, loss_one = step.get("loss_ranks"), step.get("loss_one")
        loss_distance = _relative(abs(loss_ranks - loss_one), abs(loss_one)) \
            if loss_ranks is not None and loss_one is not None else 0.0
        if worst[0] > tol or loss_distance > tol:
            what = "gradient" if worst[0] > tol else "loss"
            return Judgement(tolerance=tol, steps=len(replay.steps), largest=largest, parameters=parameters,
                             difference=Difference(
                step=int(step["step"]), what=what, parameter=worst[1] if what == "gradient" else None,
                distance=worst[0] if what == "gradient" else loss_distance, loss_ranks=loss_ranks, loss_one=loss_one,
                scale=_scale(params)))
    return Judgement(tolerance=tol, steps=len(replay.steps), largest=largest, parameters=parameters,
                     difference=None, limits=list(replay.limits))
