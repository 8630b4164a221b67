"""Hang policy: when is a rank stalled, and how long is too long.

The default threshold adapts to the job: max(30 s, 10x the slowest optimizer step seen so far), so a
slow model is not called hung while a stuck collective is reported long before gloo's or NCCL's own
10-30 minute timeouts. ``--hang-timeout`` fixes it instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

MIN_ADAPTIVE_S = 30.0
STEP_FACTOR = 10.0


@dataclass
class _RankProgress:
    progress: int = -1
    changed_at: float = 0.0
    steps: int = 0
    step_at: Optional[float] = None
    slowest_step_s: float = 0.0


@dataclass
class HangDetector:
    """Tracks heartbeat progress per rank on the supervisor's own clock."""

    fixed_timeout_s: Optional[float] = None
    ranks: dict[int, _RankProgress] = field(default_factory=dict)

    def threshold_s(self) -> float:
        if self.fixed_timeout_s is not None:
            return self.fixed_timeout_s
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

    def reset(self, rank: int, now: float) -> None:
        """Forget a stall judged to be computation, not waiting."""
        if rank in self.ranks:
            self.ranks[rank].changed_at = now

    def stalled(self, now: float, live_ranks: set[int]) -> list[int]:
        """Live ranks without progress for longer than the threshold."""
        limit = self.threshold_s()
        return sorted(r for r in live_ranks if r in self.ranks and now - self.ranks[r].changed_at > limit)

    def stall_age(self, now: float, rank: int) -> float:
        return now - self.ranks[rank].changed_at if rank in self.ranks else 0.0


def is_waiting(stack: list[dict]) -> bool:
    """A stalled rank whose innermost frame is library code (a collective, DDP's backward...) waits;
    one whose innermost frame is the user's own code is computing."""
    return not stack or not stack[-1].get("user", False)


def build_snapshot(*, reason: str, detector: HangDetector, now: float, heartbeats: dict[int, dict],
                   live: set[int], stacks: dict[int, dict]) -> dict:
    """What the report needs about a stopped job: heartbeats, stacks, who exited, who never came."""
    world = max([b.get("world_size") or 0 for b in heartbeats.values()] + [0])
    return {
        "reason": reason,
        "threshold_s": detector.threshold_s(),
        "stall_s": {str(r): round(detector.stall_age(now, r), 2) for r in heartbeats},
        "heartbeats": {str(r): b for r, b in heartbeats.items()},
        "stacks": {str(r): s for r, s in stacks.items()},
        "exited": sorted(r for r in heartbeats if r not in live),
        "missing": sorted(set(range(world)) - set(heartbeats)),
    }
