"""Run a fixture under plain torchrun with the flight recorder on and the dump harness loaded, as a
production job would run: its dumps, error files and torchrun's own log land in one folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

HARNESS = Path(__file__).resolve().parent
FIXTURES = HARNESS.parents[2] / "fixtures"
DUMP_PREFIX = "fr_trace_rank_"


def run_with_recorder(fixture: str, out: Path, *, nproc: int = 2, timeout_s: float = 3.0,
                      buffer_size: Optional[int] = None, fmt: str = "pickle", limit_s: float = 180,
                      dump_at_exit: bool = False, env_extra: Optional[dict] = None,
                      monitor_interval_s: Optional[float] = None) -> int:
    """torchrun FIXTURE on ``nproc`` gloo ranks; returns torchrun's exit status. ``out`` receives
    ``fr_trace_rank_<rank>`` dumps, ``logs/`` (torchrun --log-dir: error files) and ``torchrun.log``.
    ``timeout_s``: the harness watchdog's collective timeout; ``dump_at_exit``: every rank also dumps
    as its script ends; ``env_extra``: more variables for the script; ``monitor_interval_s``:
    torchrun's ``--monitor-interval`` (its default, 0.1 s, unless given)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join([str(HARNESS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "TORCH_FR_DUMP_TEMP_FILE": str(out / DUMP_PREFIX), "FR_HARNESS_TIMEOUT": str(timeout_s),
                "FR_HARNESS_FORMAT": fmt, "OMP_NUM_THREADS": "1",
                "FR_HARNESS_DUMP_AT_EXIT": "1" if dump_at_exit else "0", **(env_extra or {})})
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    if buffer_size is not None:
        env["TORCH_FR_BUFFER_SIZE"] = str(buffer_size)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DDPDOCTOR_ACTIVE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               f"--log-dir={out / 'logs'}",
               *([f"--monitor-interval={monitor_interval_s:g}"] if monitor_interval_s is not None else []),
               str(FIXTURES / fixture)]
    with open(out / "torchrun.log", "wb") as log:
        return subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit_s).returncode
