"""What a ddpdoctor run is asked to do, validated once: bad input is a ValueError for the user."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Optional

from ddpdoctor.schema.settings import device_mode

LAUNCH_MODES = ("auto", "torchrun", "spawn")


def reference_script() -> str:
    """The bundled reference job (ddpdoctor/fixtures/reference.py)."""
    spec = find_spec("ddpdoctor.fixtures")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the bundled reference job is missing from this installation")
    return os.path.join(list(spec.submodule_search_locations)[0], "reference.py")


def env_job_script() -> str:
    """The job behind `ddpdoctor env` (ddpdoctor/rank/env_job.py): join the process group, leave."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "env_job.py")


def validate_script(script: str) -> str:
    """The absolute path of a readable, syntactically valid Python script."""
    if not os.path.exists(script):
        raise ValueError(f"script not found: {script}")
    if os.path.isdir(script):
        raise ValueError(f"{script} is a directory; give the training script (a .py file)")
    try:
        with open(script, "rb") as f:
            compile(f.read(), script, "exec")
    except SyntaxError as exc:
        raise ValueError(f"{script}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {script}: {exc}") from None
    return os.path.abspath(script)


@dataclass(frozen=True)
class RunConfig:
    """Everything ``ddpdoctor check`` was asked to do. ``script=None`` runs the reference job."""

    script: Optional[str] = None
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 2
    nnodes: int = 1
    hang_timeout_s: Optional[float] = None  # None: adaptive, max(30 s, 10x the slowest step)
    timeout_s: Optional[float] = None
    launch: str = "auto"
    fingerprint_every: int = 0  # 0: automatic (ddpdoctor.schema.sampling)
    max_steps: Optional[int] = None  # stop the script cleanly after this many optimizer steps
    max_epochs: Optional[int] = None  # ... or after this many passes over its training loader
    select: tuple[str, ...] = ()  # check ids to run (empty: all)
    ignore: tuple[str, ...] = ()  # check ids not to run
    show_output: bool = True
    keep_evidence: Optional[str] = None
    extra_env: dict = field(default_factory=dict)
    min_busbw_gbps: Optional[float] = None  # --min-busbw: the reference job's collectives must reach this (GB/s)
    device: str = "auto"  # simulate CUDA/NCCL on CPU: auto, simulate (alias cpu: always), native; see device_mode
    # How the launch mode was chosen, when not from the options alone (a spawn guess corrected to torchrun).
    launch_note: str = ""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError("--nproc-per-node must be at least 1")
        if self.nnodes < 1:
            raise ValueError("--nnodes must be at least 1")
        for name, value in (("--hang-timeout", self.hang_timeout_s), ("--timeout", self.timeout_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds")
        if self.min_busbw_gbps is not None and self.min_busbw_gbps <= 0:
            raise ValueError("--min-busbw must be a positive bandwidth in GB/s")
        if self.fingerprint_every < 0:
            raise ValueError("--fingerprint-every must be 0 (automatic) or a positive number of steps")
        if self.launch not in LAUNCH_MODES:
            raise ValueError(f"--launch must be one of {', '.join(LAUNCH_MODES)}")
        object.__setattr__(self, "device", device_mode(self.device))  # "cpu" -> "simulate"
        for name, value in (("--max-steps", self.max_steps), ("--max-epochs", self.max_epochs)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1")

    @property
    def is_reference(self) -> bool:
        return self.script is None

    def checks(self) -> list:
        """The checks this run analyzes (--select / --ignore applied); ValueError for an unknown id."""
        from ddpdoctor.analysis.registry import load_checks
        from ddpdoctor.analysis.runner import select_checks

        return select_checks(load_checks(), self.select, self.ignore)

    def script_path(self) -> str:
        return reference_script() if self.script is None else validate_script(self.script)
