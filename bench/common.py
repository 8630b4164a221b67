"""What every benchmark shares: running a command timed, the processes it started, and printing a table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
WORKLOADS = ROOT / "bench" / "workloads"
PY = sys.executable
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"}


@dataclass
class Run:
    wall_s: float
    returncode: int
    output: str

    @property
    def crash(self) -> str:
        """"" for a clean exit, else how it ended (a signal by name where there was one)."""
        if self.returncode == 0:
            return ""
        for line in self.output.splitlines():
            if "Signal " in line and "SIG" in line:  # torchrun: "Signal 11 (SIGSEGV) received by PID"
                return "crashed: " + line[line.index("SIG"):].split(")")[0]
        if self.returncode < 0:
            return f"crashed: {signal.Signals(-self.returncode).name}"
        return f"exit {self.returncode}"


def one_rank_env() -> None:
    """This process as rank 0 of a one-process gloo group, on a port of its own (in-process benchmarks)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")


def overhead_mlp(width: int = 1024):  # -> torch.nn.Sequential (torch is imported only by those who build it)
    """The user-overhead job's MLP (bench/workloads/mlp_step.py's default, 9.5M parameters at width 1024),
    not wrapped: nine Linear+ReLU layers and a Linear to 10 classes, built in that order."""
    import torch.nn as nn

    layers: list[nn.Module] = []
    for _ in range(9):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def run(cmd: list[str], cwd: str, env: dict | None = None, timeout: float = 900) -> Run:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    return Run(time.monotonic() - start, proc.returncode, proc.stdout + proc.stderr)


def torchrun(script: Path, *args: str) -> list[str]:
    """Plain torchrun on a free port (--standalone): other jobs on the machine may hold 29500."""
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]


def doctor(script: Path | None, *options: str, script_args: tuple[str, ...] = ()) -> list[str]:
    head = [PY, "-m", "ddpdoctor", "check"] + ([str(script)] if script else [])
    return head + ["--plain", *options] + (["--", *script_args] if script_args else [])


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, read from /proc (Linux): each process's parent from its
    ``stat``, so a child started by any thread of its parent is found."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def table(title: str, header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
