"""What a ddpdoctor run is asked to do, validated once: bad input is a ValueError for the user."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any, Optional

from ddpdoctor.supervisor import options as opts


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
    """Everything ``ddpdoctor check`` was asked to do. ``script=None`` runs the reference job.

    A field that an option sets takes the option's name and default from
    :mod:`ddpdoctor.supervisor.options`, and its validation (tests/unit/test_options.py checks both)."""

    script: Optional[str] = None
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = opts.NPROC_PER_NODE.default
    nnodes: int = opts.NNODES.default
    hang_timeout_s: Optional[float] = opts.HANG_TIMEOUT.default  # None: adaptive (supervisor/hang.py)
    timeout_s: Optional[float] = opts.TIMEOUT.default
    launch: str = opts.LAUNCH.default
    fingerprint_every: int = opts.FINGERPRINT_EVERY.default  # 0: automatic (ddpdoctor.schema.sampling)
    max_steps: Optional[int] = opts.MAX_STEPS.default  # stop the script cleanly after this many optimizer steps
    max_epochs: Optional[int] = opts.MAX_EPOCHS.default  # ... or after this many passes over its training loader
    select: tuple[str, ...] = opts.SELECT.default  # check ids to run (empty: all)
    ignore: tuple[str, ...] = opts.IGNORE.default  # check ids not to run
    show_output: bool = not opts.QUIET.default
    keep_evidence: Optional[str] = opts.KEEP_EVIDENCE.default
    extra_env: dict = field(default_factory=dict)
    min_busbw_gbps: Optional[float] = opts.MIN_BUSBW.default  # the reference job's collectives must reach this
    device: str = opts.DEVICE.default  # simulate CUDA/NCCL on CPU: auto, simulate (alias cpu: always), native
    against_one_rank: Optional[int] = opts.AGAINST_ONE_RANK.default  # replay this many steps in one process
    # --against-one-rank's side of this launch: "record" (the N ranks) or "replay" (the one process), and its folder
    one_rank_role: str = ""
    one_rank_dir: str = ""
    # How the launch mode was chosen, when not from the options alone (a spawn guess corrected to torchrun).
    launch_note: str = ""

    def __post_init__(self) -> None:
        for option in opts.RUN_FIELDS:  # each raises ValueError naming its flag; "cpu" -> "simulate"
            object.__setattr__(self, option.name, option.check(getattr(self, option.name)))

    @classmethod
    def from_options(cls, values: dict[str, Any], **fields: Any) -> "RunConfig":
        """A run from resolved option values (:func:`ddpdoctor.supervisor.options.resolve`), plus ``fields``."""
        run = {o.name: values[o.name] for o in opts.RUN_FIELDS if o.name in values}
        if "quiet" in values:
            run["show_output"] = not values["quiet"]
        return cls(**run, **fields)

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
