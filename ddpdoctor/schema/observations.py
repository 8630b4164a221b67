"""What the supervisor side observes about a running job, as typed records.

Heartbeats and stack dumps travel from each rank's watchdog to the monitor (through files or the
c10d store); the monitor's stop snapshot, torchrun's failure table and the ranks' last output
lines go to the analysis with the evidence. Ranks are ints everywhere; JSON keys become strings
only on the wire.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

__all__ = ["Heartbeat", "StackDump", "RankState", "StopSnapshot", "Failure", "Outcome", "OneRankReplay", "Observations"]


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(kw_only=True, slots=True)
class Heartbeat:
    """A rank's progress, written every heartbeat period by its watchdog.

    ``state``/``detail``/``since``/``where`` say what the rank does at ``t``, read from its main
    thread's stack with the rules of :mod:`ddpdoctor.schema.rank_state` (one of its ``STATES``:
    "computing", "waiting" in ``detail`` such as "all_reduce #5", "loading data", "finished",
    "crashed"...); ``since`` is when that began. ``activity`` stays the probes' own note, which the
    hang policy reads. Watchdogs beat on wall-clock ticks, so every rank's counters are sampled at
    the same instant and steps compare across ranks.
    """

    pid: int
    rank: Optional[int] = None
    world_size: Optional[int] = None
    local_rank: Optional[int] = None
    node_rank: Optional[int] = None
    agent: Optional[int] = None
    host: str = ""
    t: float = 0.0
    progress: int = 0  # bumped by every probe callback: a value that stops changing is a stall
    steps: int = 0
    epoch: Optional[int] = None
    seq: int = 0
    activity: str = "starting"
    site: Optional[dict[str, Any]] = None
    last_collective: Optional[dict[str, Any]] = None  # {"op", "n", "site"}: what this rank last enqueued
    state: str = "starting"
    detail: Optional[str] = None
    since: Optional[float] = None  # wall time the state (with its detail) began
    where: Optional[dict[str, Any]] = None  # {"file", "line", "function"}: the innermost frame of the user's code
    passes: int = 0  # passes over the training loader completed (the epoch, when set_epoch is never called)
    exit: Optional[dict[str, Any]] = None  # how the script ended: {"code", "exception", "cut"}

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Heartbeat":
        return cls(**_known(cls, data))


@dataclass(kw_only=True, slots=True)
class StackDump:
    """The answer to a stack-dump request: the main thread's Python stack, outermost first."""

    token: str
    heartbeat: Heartbeat
    stack: list[dict[str, Any]] = field(default_factory=list)  # [{"file", "line", "function", "code", "user"}]

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "heartbeat": self.heartbeat.to_json(), "stack": self.stack}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StackDump":
        return cls(token=data.get("token", ""), heartbeat=Heartbeat.from_json(data.get("heartbeat") or {"pid": 0}),
                   stack=list(data.get("stack") or []))


@dataclass(kw_only=True, slots=True)
class RankState:
    """One rank when the monitor stopped the job.

    ``state``: "waiting" (in a collective or DDP's communication), "busy" (in library code that is
    not communication: I/O, data loading, a large save), "computing" (in the user's own code),
    "exited", or "never started".
    """

    rank: int
    state: str
    waiting_in: Optional[str] = None
    stalled_s: Optional[float] = None
    heartbeat: Optional[Heartbeat] = None
    stack: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["heartbeat"] = self.heartbeat.to_json() if self.heartbeat else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RankState":
        values = _known(cls, data)
        if isinstance(values.get("heartbeat"), dict):
            values["heartbeat"] = Heartbeat.from_json(values["heartbeat"])
        return cls(**values)


@dataclass(kw_only=True, slots=True)
class StopSnapshot:
    """Why and where the monitor stopped a job that had not ended by itself.

    ``reason``: "hang" (ranks wait in communication and none progresses), "no-progress" (no rank
    progressed for long, but not provably in a collective), "timeout" (--timeout), "interrupted"
    (a stop signal reached ddpdoctor: Ctrl-C, SIGTERM, a scheduler's signal; ``signal`` names it,
    ``signal_rank`` is the rank whose ddpdoctor got it when that was not the reporting process).
    """

    reason: str
    threshold_s: float
    ranks: dict[int, RankState] = field(default_factory=dict)
    signal: Optional[str] = None
    t: float = 0.0  # wall time of the decision (of the signal): errors raised after it come from stopping the job
    signal_rank: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "threshold_s": self.threshold_s, "signal": self.signal, "t": self.t,
                "signal_rank": self.signal_rank,
                "ranks": {str(r): s.to_json() for r, s in sorted(self.ranks.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StopSnapshot":
        return cls(reason=data["reason"], threshold_s=float(data.get("threshold_s") or 0.0), signal=data.get("signal"),
                   t=float(data.get("t") or 0.0), signal_rank=data.get("signal_rank"),
                   ranks={int(r): RankState.from_json(s) for r, s in (data.get("ranks") or {}).items()})


@dataclass(kw_only=True, slots=True)
class Failure:
    """One row of torchrun's failure table (or an exit code reported by a rank's own supervisor)."""

    rank: int
    exitcode: int = 0
    signal: Optional[str] = None
    local_rank: Optional[int] = None
    pid: Optional[int] = None
    t: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Failure":
        return cls(**_known(cls, data))


class Outcome(str, Enum):
    """How the run ended (``Observations.outcome``, the report's ``outcome``). A ``str`` enum:
    ``Outcome.HUNG == "hung"``, and JSON writes "hung"."""

    COMPLETED = "completed"
    FAILED = "failed"
    HUNG = "hung"  # a hang, or no progress, stopped by ddpdoctor (or shown by flight recorder dumps)
    TIMEOUT = "timeout"  # --timeout
    # a stop signal: Ctrl-C, SIGTERM, a scheduler's; the stop snapshot names it, and the counts it cut
    # off are left out of the analysis
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its value, so "hung" finds Outcome.HUNG in a set or dict
        return hash(self.value)


@dataclass(kw_only=True)
class OneRankReplay:
    """--against-one-rank: the job's first optimizer steps replayed in one process on the union of the
    ranks' batches, each step from rank 0's weights before it, compared with what the N ranks computed.
    The replay process measures (it holds both sides' tensors); the global-batch check judges."""

    world_size: int = 0  # ranks of the recorded run
    steps_requested: int = 0
    # per compared optimizer step: {"optimizer", "step", "loss_ranks" (mean over ranks of what each passed to
    # backward), "loss_one", "params": [[name, |g_N - g_1|, |g_N|, |g_1|, <g_N, g_1>], ...]}
    steps: list[dict[str, Any]] = field(default_factory=list)
    # why the comparison cannot be exact (dropout, BatchNorm's per-rank statistics, data not from a DataLoader...)
    limits: list[str] = field(default_factory=list)
    precision: str = "float32"  # the lowest precision the step computes in (parameters, autocast)
    rows: int = 0  # elements of the largest tensor of the global batch: the longest sum of a gradient
    fan_in: int = 0  # the widest layer's inputs: the longest sum of a forward
    batches: str = ""  # how the global batch was formed: "joined" (the ranks' batches concatenated), "collated"
    error: Optional[str] = None  # the replay could not run or compare (then nothing else is judged)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OneRankReplay":
        return cls(**_known(cls, data))


@dataclass(kw_only=True)
class Observations:
    """Everything the supervisor side knows about the run besides the ranks' own events."""

    outcome: str = Outcome.COMPLETED  # an Outcome (a plain string when read back from JSON)
    world_size: int = 0
    nnodes: int = 1
    launch_mode: str = "torchrun"
    # {"mode", "detected" (existing launch: "torchrun" | "slurm" | "environment"), "exported" (variables ddpdoctor
    # set for the script), "scheduler" ({"name": "slurm", "job_id", "step_id", "nodes", "num_tasks", ...})}
    launch: dict[str, Any] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    stop: Optional[StopSnapshot] = None
    timeout_s: Optional[float] = None
    output_tails: dict[int, list[str]] = field(default_factory=dict)  # rank -> last lines of its output
    missing_ranks: list[int] = field(default_factory=list)
    stalls: list[StopSnapshot] = field(default_factory=list)  # no-progress episodes that resolved
    min_busbw_gbps: Optional[float] = None  # --min-busbw: the collective-bandwidth check's floor
    launcher_log: list[str] = field(default_factory=list)  # torchrun's own log lines, kept off the screen
    one_rank: Optional[OneRankReplay] = None  # --against-one-rank's replay, when asked for

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "world_size": self.world_size, "nnodes": self.nnodes,
                "launch_mode": self.launch_mode, "launch": self.launch,
                "failures": [f.to_json() for f in self.failures],
                "stop": self.stop.to_json() if self.stop else None, "timeout_s": self.timeout_s,
                "output_tails": {str(r): lines for r, lines in sorted(self.output_tails.items())},
                "missing_ranks": self.missing_ranks, "stalls": [s.to_json() for s in self.stalls],
                "min_busbw_gbps": self.min_busbw_gbps, "launcher_log": list(self.launcher_log),
                "one_rank": self.one_rank.to_json() if self.one_rank else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Observations":
        return cls(outcome=data.get("outcome", "completed"), world_size=int(data.get("world_size") or 0),
                   nnodes=int(data.get("nnodes") or 1), launch_mode=data.get("launch_mode", "torchrun"),
                   launch=dict(data.get("launch") or {}),
                   failures=[Failure.from_json(f) for f in data.get("failures") or []],
                   stop=StopSnapshot.from_json(data["stop"]) if data.get("stop") else None,
                   timeout_s=data.get("timeout_s"),
                   output_tails={int(r): list(v) for r, v in (data.get("output_tails") or {}).items()},
                   missing_ranks=list(data.get("missing_ranks") or []),
                   stalls=[StopSnapshot.from_json(s) for s in data.get("stalls") or []],
                   min_busbw_gbps=data.get("min_busbw_gbps"), launcher_log=list(data.get("launcher_log") or []),
                   one_rank=OneRankReplay.from_json(data["one_rank"]) if data.get("one_rank") else None)
