"""Hang policy: when is the job stalled, and is a stalled rank waiting for its peers?

The default threshold adapts to the job: max(30 s, 10x the slowest optimizer step seen so far), so a
slow model is not called hung while a stuck collective is reported long before gloo's or NCCL's own
10-30 minute timeouts. ``--hang-timeout`` fixes it instead.

A stalled rank is classified from its main thread's Python stack: *waiting* in communication (a
collective, DDP's gradient all-reduce or its broadcasts), *busy* in library code that is not
communication (a large torch.save, a DataLoader waiting on its workers), or *computing* in the
user's own code. Only a job whose live ranks all wait is hung.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.schema.observations import Heartbeat

MIN_ADAPTIVE_S = 30.0
STEP_FACTOR = 10.0

_DDP_FILE = "torch/nn/parallel/distributed.py"
# (function or code fragment in DDP's own frames, what the rank waits in), most specific first.
_DDP_WAITS = (
    ("_rebuild_buckets", "DDP's first-iteration bucket rebuild (a broadcast of the bucket order from rank 0)"),
    ("_sync_buffers", "DDP's buffer broadcast"),
    ("_sync_module_buffers", "DDP's buffer broadcast"),
    ("_default_broadcast_coalesced", "DDP's buffer broadcast"),
    ("_check_global_requires_backward_grad_sync", "Join's check of which ranks still train"),
    ("_verify_param_shape_across_processes", "DDP's constructor (checking parameter shapes across ranks)"),
    ("_sync_params_and_buffers", "DDP's constructor (broadcasting parameters from rank 0)"),
    ("__init__", "DDP's constructor"),
)


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

    def stall_age(self, now: float, rank: int) -> float:
        return now - self.ranks[rank].changed_at if rank in self.ranks else 0.0

    def job_stall_age(self, now: float, live: set[int]) -> float:
        """Seconds since any live rank last made progress (0 when none is tracked)."""
        ages = [self.stall_age(now, r) for r in live if r in self.ranks]
        return min(ages) if ages and len(ages) == len(live) else 0.0


def classify(stack: list[dict], heartbeat: Optional[Heartbeat]) -> tuple[str, Optional[str]]:
    """(state, what it waits in) of a stalled rank: "waiting", "busy" or "computing"."""
    activity = heartbeat.activity if heartbeat else ""
    if activity.startswith("in "):  # inside a traced torch.distributed call
        return "waiting", activity[3:]
    files = [(f.get("file") or "").replace("\\", "/") for f in stack]
    ddp_frames = [f for f, path in zip(stack, files) if path.endswith(_DDP_FILE)]
    if ddp_frames:
        innermost = ddp_frames[-1]
        for needle, what in _DDP_WAITS:
            if needle == innermost.get("function") or needle in (innermost.get("code") or ""):
                return "waiting", what
    if any("torch/autograd" in path for path in files):
        return "waiting", "the backward pass (DDP's gradient all-reduce)"
    if any("torch/distributed" in path for path in files):
        inner = next((f for f, p in zip(reversed(stack), reversed(files)) if "torch/distributed" in p), {})
        return "waiting", f"a torch.distributed call ({inner.get('function', '?')})"
    if ddp_frames:
        return "waiting", "DDP's forward"
    if not stack:
        return "waiting", activity or "an unknown place"
    if stack[-1].get("user"):
        return "computing", None
    user = [f for f in stack if f.get("user")]
    caller = f" called from {user[-1]['file'].rsplit('/', 1)[-1]}:{user[-1]['line']}" if user else ""
    return "busy", _busy_in(stack, files) + caller


_KNOWN_BUSY = (
    ("torch/utils/data", "the DataLoader (waiting for a batch)"),
    ("torch/serialization.py", "torch.save / torch.load"),
    ("torch/distributed/checkpoint", "torch.distributed.checkpoint"),
)


def _busy_in(stack: list[dict], files: list[str]) -> str:
    """The library call a busy rank is in: a known torch component, else the innermost frame."""
    for needle, what in _KNOWN_BUSY:
        if any(needle in path for path in files):
            return what
    innermost = stack[-1]
    return f"{innermost.get('function')} ({innermost.get('file', '').rsplit('/', 1)[-1]})"
