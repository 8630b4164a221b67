"""Hang policy: when is the job stalled, and is a stalled rank waiting for its peers?

The default threshold adapts to the job: max(30 s, 10x the slowest optimizer step seen so far), so a
slow model is not called hung while a stuck collective is reported long before gloo's or NCCL's own
10-30 minute timeouts. ``--hang-timeout`` fixes it instead. The option, with these numbers, is
declared in :mod:`ddpdoctor.supervisor.options`.

A stalled rank is classified from its main thread's Python stack: *waiting* in communication (a
collective, DDP's gradient all-reduce or its broadcasts), *busy* in library code that is not
communication (a large torch.save, a DataLoader waiting on its workers), or *computing* in the
user's own code. Only a job whose live ranks all wait is hung.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.schema import rank_state
from ddpdoctor.schema.observations import Heartbeat
from ddpdoctor.supervisor.options import ADAPTIVE_HANG_MIN_S as MIN_ADAPTIVE_S
from ddpdoctor.supervisor.options import ADAPTIVE_HANG_STEP_FACTOR as STEP_FACTOR


@dataclass
class _RankProgress:
    progress: int = -1
    changed_at: float = 0.0
    steps: int = 0
    step_at: Optional[float] = None
    slowest_step_s: float = 0.0


@dataclass
class HangDetector:
    """Tracks heartbeat progress per rank on the monitor's own clock."""

    hang_timeout_s: Optional[float] = None  # --hang-timeout; None: adaptive
    ranks: dict[int, _RankProgress] = field(default_factory=dict)

    def threshold_s(self) -> float:
        if self.hang_timeout_s is not None:
            return self.hang_timeout_s
        slowest = max((r.slowest_step_s for r in self.ranks.values()), default=0.0)
        return max(MIN_ADAPTIVE_S, STEP_FACTOR * slowest)

    def observe(self, now: float, rank: int, progress: int, steps: int) -> None:
        state = self.ranks.setdefault(rank, _RankProgress(changed_at=now))
        if progress != state.progress:
            state.progress = progress
            state.changed_at = now
        if steps != state.steps:
            if state.step_at is not None and steps > state.steps:
                state.slowest_step_s = max(state.slowest_step_s, (now - state.step_at) / (steps - state.steps))
            state.steps = steps
            state.step_at = now

    def stall_age(self, now: float, rank: int) -> float:
        return now - self.ranks[rank].changed_at if rank in self.ranks else 0.0

    def job_stall_age(self, now: float, live: set[int]) -> float:
        """Seconds since any live rank last made progress (0 when none is tracked)."""
        ages = [self.stall_age(now, r) for r in live if r in self.ranks]
        return min(ages) if ages and len(ages) == len(live) else 0.0


def classify(stack: list[dict], heartbeat: Optional[Heartbeat]) -> tuple[str, Optional[str]]:
    """(state, what it waits in) of a stalled rank: "waiting", "busy" or "computing" (the rules live
    in :mod:`ddpdoctor.schema.rank_state`, shared with the ranks' live view)."""
    return rank_state.classify(stack, heartbeat.activity if heartbeat else "")
