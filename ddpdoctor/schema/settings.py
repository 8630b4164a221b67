"""The settings the supervisor side passes to every rank process, through environment variables.

Environment variables, not arguments, because they reach every process the user's script starts
(torchrun workers, torch.multiprocessing.spawn children) without touching the script's argv.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

EVIDENCE_DIR = "DDPDOCTOR_EVIDENCE_DIR"
FINGERPRINT_EVERY = "DDPDOCTOR_FINGERPRINT_EVERY"
SCRIPT = "DDPDOCTOR_SCRIPT"
HEARTBEAT_S = "DDPDOCTOR_HEARTBEAT_S"
ACTIVE = "DDPDOCTOR_ACTIVE"  # set inside a job ddpdoctor runs: a nested `ddpdoctor check` is the job itself
AGENT = "DDPDOCTOR_AGENT"  # index of the torchrun agent (simulated node) that started this rank
MAX_STEPS = "DDPDOCTOR_MAX_STEPS"
MAX_EPOCHS = "DDPDOCTOR_MAX_EPOCHS"
DEVICE = "DDPDOCTOR_DEVICE"  # device simulation: auto | simulate (alias cpu) | native (ddpdoctor.rank.devicesim)
NPROC_PER_NODE = "DDPDOCTOR_NPROC_PER_NODE"  # simulated GPUs per node where LOCAL_WORLD_SIZE is unset (mp.spawn)
FR_DUMPS = "DDPDOCTOR_FR_DUMPS"  # --keep-evidence: ranks write flight recorder dumps into the evidence folder
# Set to "1" when the supervisor guessed spawn mode from the script's source (--launch auto): a launcher
# process that then sets up its process group from torchrun's variables asks to be relaunched under
# torchrun, by leaving RELAUNCH_UNDER_TORCHRUN in the evidence folder (its contents: the call site).
SPAWN_GUESSED = "DDPDOCTOR_SPAWN_GUESSED"
RELAUNCH_UNDER_TORCHRUN = "relaunch-under-torchrun.json"
# --against-one-rank: "record" (each rank of the N-rank run keeps what the replay needs) or "replay" (the one
# process that replays it), the folder they share, and how many optimizer steps.
ONE_RANK_ROLE = "DDPDOCTOR_ONE_RANK_ROLE"
ONE_RANK_DIR = "DDPDOCTOR_ONE_RANK_DIR"
ONE_RANK_STEPS = "DDPDOCTOR_ONE_RANK_STEPS"
ONE_RANK_RESULT = "one-rank.json"  # what the replay measured, in ONE_RANK_DIR
# Set for the supervisor: a folder where each run writes the analysis's whole input beside its JSON report,
# so the analysis can be replayed offline (the golden-report test).
CAPTURE_DIR = "DDPDOCTOR_CAPTURE_DIR"

DEFAULT_HEARTBEAT_S = 0.5

# Device simulation (CUDA/NCCL on CPU ranks): "auto" where the ranks see no GPU and nothing chose the
# CPU, "simulate" always, "native" never. "cpu" is the old name of "simulate", kept as an alias.
DEVICE_MODES = ("auto", "simulate", "native")
DEVICE_ALIASES = {"cpu": "simulate"}
GPU_VISIBLE = "a GPU is visible"  # why "auto" left the simulation off on a GPU machine (nothing to report)


def device_mode(value: str) -> str:
    """The device mode ``value`` names (an alias resolved); ValueError for anything else."""
    mode = DEVICE_ALIASES.get(value, value)
    if mode not in DEVICE_MODES:
        names = ", ".join((*DEVICE_MODES, *(f"{a} (= {m})" for a, m in DEVICE_ALIASES.items())))
        raise ValueError(f"--device must be one of {names}, not {value!r}")
    return mode


@dataclass(frozen=True)
class RankSettings:
    """What a rank process reads from its environment at start-up."""

    evidence_dir: str
    fingerprint_every: int = 0
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    agent: Optional[int] = None
    max_steps: Optional[int] = None  # stop the script cleanly after this many optimizer steps
    max_epochs: Optional[int] = None  # ... or when a training loader starts this many + 1 passes
    device: str = "auto"  # simulate CUDA/NCCL on CPU: "auto", "simulate" (always), "native" (see DEVICE_MODES)
    nproc_per_node: Optional[int] = None  # GPUs a simulated node shows before workers exist (mp.spawn launcher)
    flight_recorder_dumps: bool = False  # write flight recorder dumps (at the end, on a hang) for --keep-evidence
    one_rank_role: str = ""  # --against-one-rank: "record", "replay", or "" (off)
    one_rank_dir: str = ""
    one_rank_steps: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "RankSettings":
        return cls(evidence_dir=env[EVIDENCE_DIR],
                   fingerprint_every=int(env.get(FINGERPRINT_EVERY) or 0),
                   heartbeat_s=float(env.get(HEARTBEAT_S) or DEFAULT_HEARTBEAT_S),
                   agent=int(env[AGENT]) if env.get(AGENT) else None,
                   max_steps=int(env[MAX_STEPS]) if env.get(MAX_STEPS) else None,
                   max_epochs=int(env[MAX_EPOCHS]) if env.get(MAX_EPOCHS) else None,
                   device=env.get(DEVICE) or "auto",
                   nproc_per_node=int(env[NPROC_PER_NODE]) if env.get(NPROC_PER_NODE) else None,
                   flight_recorder_dumps=env.get(FR_DUMPS) == "1",
                   one_rank_role=env.get(ONE_RANK_ROLE) or "", one_rank_dir=env.get(ONE_RANK_DIR) or "",
                   one_rank_steps=int(env.get(ONE_RANK_STEPS) or 0))

    def to_env(self) -> dict[str, str]:
        env = {EVIDENCE_DIR: self.evidence_dir, FINGERPRINT_EVERY: str(self.fingerprint_every),
               HEARTBEAT_S: str(self.heartbeat_s), ACTIVE: "1"}
        if self.agent is not None:
            env[AGENT] = str(self.agent)
        if self.max_steps is not None:
            env[MAX_STEPS] = str(self.max_steps)
        if self.max_epochs is not None:
            env[MAX_EPOCHS] = str(self.max_epochs)
        env[DEVICE] = self.device
        if self.nproc_per_node is not None:
            env[NPROC_PER_NODE] = str(self.nproc_per_node)
        if self.flight_recorder_dumps:
            env[FR_DUMPS] = "1"
        if self.one_rank_role:
            env.update({ONE_RANK_ROLE: self.one_rank_role, ONE_RANK_DIR: self.one_rank_dir,
                        ONE_RANK_STEPS: str(self.one_rank_steps)})
        return env
