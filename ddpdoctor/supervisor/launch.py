"""Launch planning: which mode, which commands, which environment. No process is started here."""

from __future__ import annotations

import ast
import os
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor import envvars

SPAWN_CALLS = {"spawn", "start_processes"}

# Started by file path, not `python -m`: -m puts the current directory first on sys.path, and a
# checkout of ddpdoctor there would shadow the installed package inside every rank.
_HERE = os.path.dirname(os.path.abspath(__file__))
BOOTSTRAP = os.path.join(_HERE, "bootstrap.py")
AGENT = os.path.join(_HERE, "agent.py")


@dataclass(frozen=True)
class RunConfig:
    """Everything ``ddpdoctor check`` was asked to do."""

    script: str
    script_args: tuple[str, ...] = ()
    is_reference: bool = False
    nproc_per_node: int = 2
    nnodes: int = 1
    hang_timeout_s: Optional[float] = None
    timeout_s: Optional[float] = None
    launch: str = "auto"
    fingerprint_every: int = 0  # 0: automatic (ddpdoctor.sampling)
    show_output: bool = True


@dataclass
class LaunchPlan:
    mode: str  # "torchrun" or "spawn"
    commands: list[list[str]]
    env: dict[str, str]
    agent_outputs: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uses_own_spawn(script: str) -> bool:
    """Whether the script starts its workers with torch.multiprocessing.spawn / start_processes."""
    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=script)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in SPAWN_CALLS:
                return True
    return False


def choose_mode(config: RunConfig) -> str:
    if config.launch != "auto":
        return config.launch
    return "spawn" if uses_own_spawn(config.script) else "torchrun"


def build_plan(config: RunConfig, evidence_dir: str) -> LaunchPlan:
    env = dict(os.environ)
    env[envvars.EVIDENCE_DIR] = evidence_dir
    env[envvars.FINGERPRINT_EVERY] = str(config.fingerprint_every)
    env[envvars.ACTIVE] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set, without its banner
    env["PYTHONUNBUFFERED"] = "1"  # rank output shows up live, not at exit
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    script = os.path.abspath(config.script)
    mode = choose_mode(config)
    if mode == "spawn":
        command = [sys.executable, BOOTSTRAP, script, *config.script_args]
        return LaunchPlan(mode="spawn", commands=[command], env=env)
    port = free_port()
    run_id = f"ddpdoctor-{uuid.uuid4().hex[:8]}"
    commands, outputs = [], []
    for node in range(config.nnodes):
        out = os.path.join(evidence_dir, f"agent-{node}.json")
        torchrun_args = [
            f"--nnodes={config.nnodes}",
            f"--nproc-per-node={config.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
            "--max-restarts=0",
            "--monitor-interval=0.1",
            "--tee=3",
            f"--log-dir={os.path.join(evidence_dir, f'logs-{node}')}",
            BOOTSTRAP,
            script,
            *config.script_args,
        ]
        commands.append([sys.executable, AGENT, out, "--", *torchrun_args])
        outputs.append(out)
    return LaunchPlan(mode="torchrun", commands=commands, env=env, agent_outputs=outputs)
