"""Launch planning: which mode, which commands, which environment. No process is started here.

1. torchrun: ``--nnodes`` local torch.distributed.run agents (c10d rendezvous on 127.0.0.1, a free
   port) start the rank bootstrap, which installs the probes and runs the script.
2. spawn: a script that starts its own workers (torch.multiprocessing.spawn / start_processes) runs
   once under the bootstrap; the probes go into every worker it spawns.
3. existing launch: under torchrun or any launcher that set RANK and WORLD_SIZE, or as a task of
   a multi-task Slurm step (slurm.py maps its variables), each rank's ddpdoctor starts the
   bootstrap as one child process with the rank's own environment.
"""

from __future__ import annotations

import ast
import os
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ddpdoctor.schema import settings
from ddpdoctor.supervisor import slurm
from ddpdoctor.supervisor.config import RunConfig

SPAWN_CALLS = {"spawn", "start_processes"}

# Started by file path, not `python -m`: -m puts the current directory first on sys.path, and a
# checkout of ddpdoctor there would shadow the installed package inside every rank.
_RANK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank")
BOOTSTRAP = os.path.join(_RANK_DIR, "bootstrap.py")
AGENT = os.path.join(_RANK_DIR, "agent.py")
FR_BUFFER_SIZE = "2000"  # flight recorder entries per rank (torch 2.13's default; older torch: 0, off)
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE")


@dataclass(frozen=True)
class ExistingLaunch:
    """This process as one rank of a launch someone else made, and how that was detected."""

    detected: str  # "torchrun" (TORCHELASTIC_* set), "slurm" (a multi-task srun step), "environment" (RANK, WORLD_SIZE)
    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    agent_store: bool = False  # torchrun's agent store is there to use (TORCHELASTIC_USE_AGENT_STORE)
    run_id: str = "default"
    exported: dict = field(default_factory=dict)  # variables ddpdoctor sets for the script (Slurm's mapping)
    num_nodes: Optional[int] = None  # what the launcher says (torchrun's GROUP_WORLD_SIZE, the step's nodes)

    @property
    def nnodes(self) -> int:
        return self.num_nodes or max(1, self.world_size // max(1, self.local_world_size))


def existing_launch(env: Mapping[str, str] = os.environ) -> Optional[ExistingLaunch]:
    """This process as a rank of someone else's launch, None when ddpdoctor launches the ranks.

    Variables a launcher set (RANK, WORLD_SIZE...) win over Slurm's, so `srun torchrun ... -m
    ddpdoctor check` is a torchrun launch; a rank of a job ddpdoctor launched is never one."""
    if settings.ACTIVE in env:
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or "default"
    if "RANK" in env and "WORLD_SIZE" in env:
        try:
            world_size = int(env["WORLD_SIZE"])
            return ExistingLaunch(
                detected="torchrun" if "TORCHELASTIC_RUN_ID" in env else "environment", rank=int(env["RANK"]),
                world_size=world_size, local_rank=int(env.get("LOCAL_RANK") or 0),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE") or world_size),
                node_rank=int(env.get("GROUP_RANK") or 0), master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                master_port=int(env.get("MASTER_PORT") or 29500),
                agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", run_id=run_id,
                num_nodes=int(env["GROUP_WORLD_SIZE"]) if env.get("GROUP_WORLD_SIZE") else None)
        except ValueError as exc:
            raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT must be integers: {exc}") from None
    step = slurm.detect(env)
    if step is None:
        return None
    return ExistingLaunch(detected="slurm", rank=step.rank, world_size=step.world_size, local_rank=step.local_rank,
                          local_world_size=step.local_world_size, node_rank=step.node_rank,
                          master_addr=step.master_addr, master_port=step.master_port, run_id=run_id,
                          exported=step.variables(), num_nodes=len(step.nodes) or None)


@dataclass
class LaunchPlan:
    mode: str  # "torchrun" | "spawn" | "existing-launch"
    commands: list[list[str]]
    env: dict[str, str]
    env_per_command: list[dict] = field(default_factory=list)
    agent_outputs: list[str] = field(default_factory=list)
    world_size: int = 0  # 0: known only once the ranks start (spawn)
    existing: Optional[ExistingLaunch] = None  # mode "existing-launch": this rank and its launcher
    scheduler: Optional[dict] = None  # the cluster job this runs in (Slurm: job id, step, nodes), for the report


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


def choose_mode(config: RunConfig, script: str, existing: Optional[ExistingLaunch] = None) -> str:
    if existing is not None:
        return "existing-launch"
    if config.launch != "auto":
        return config.launch
    return "spawn" if uses_own_spawn(script) else "torchrun"


def _rank_env(config: RunConfig, evidence_dir: str, *, keep_launcher_vars: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not keep_launcher_vars:
        for name in _LAUNCHER_VARS:
            env.pop(name, None)
    env.update(settings.RankSettings(evidence_dir=evidence_dir, fingerprint_every=config.fingerprint_every,
                                     max_steps=config.max_steps, max_epochs=config.max_epochs,
                                     device=config.device, nproc_per_node=config.nproc_per_node,
                                     flight_recorder_dumps=config.keep_evidence is not None,
                                     one_rank_role=config.one_rank_role, one_rank_dir=config.one_rank_dir,
                                     one_rank_steps=config.against_one_rank or 0).to_env())
    env["PYTHONUNBUFFERED"] = "1"  # rank output shows up live, not at exit
    env.update(config.extra_env)
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        env["TORCH_FR_BUFFER_SIZE"] = FR_BUFFER_SIZE  # the flight recorder on, unless the user chose its size
    return env


def build_plan(config: RunConfig, script: str, evidence_dir: str, *,
               existing: Optional[ExistingLaunch] = None) -> LaunchPlan:
    mode = choose_mode(config, script, existing)
    bootstrap = [sys.executable, BOOTSTRAP, script, *config.script_args]
    scheduler = slurm.job(os.environ)
    if existing is not None:
        env = _rank_env(config, evidence_dir, keep_launcher_vars=True)
        env.update(existing.exported)
        return LaunchPlan(mode=mode, commands=[bootstrap], world_size=existing.world_size, env=env, existing=existing,
                          scheduler=scheduler)
    env = _rank_env(config, evidence_dir, keep_launcher_vars=False)
    if mode == "torchrun" and (config.nproc_per_node > 1 or config.one_rank_role == "replay"):
        # What torchrun itself sets where it starts several processes per node, here without its banner;
        # and --against-one-rank's replay, to run with the threads its ranks had. Nowhere else: a
        # one-process node, the script's own mp.spawn and an existing launch keep the intra-op threads
        # they have without ddpdoctor.
        env.setdefault("OMP_NUM_THREADS", "1")
    if mode == "spawn":
        if config.launch == "auto":  # guessed from the source: the launcher may still ask for torchrun
            env[settings.SPAWN_GUESSED] = "1"
        return LaunchPlan(mode=mode, commands=[bootstrap], env=env, scheduler=scheduler)
    # One agent hosts the rendezvous store on a port the OS gives it when it binds (as torchrun's
    # --standalone does): a port picked here and bound later can be taken in between by another job's
    # socket on a busy machine (EADDRINUSE). Several simulated nodes must all know the port in advance.
    port = free_port() if config.nnodes > 1 else 0
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
            BOOTSTRAP, script, *config.script_args,
        ]
        commands.append([sys.executable, AGENT, out, "--", *torchrun_args])
        outputs.append(out)
    return LaunchPlan(mode=mode, commands=commands, env=env, agent_outputs=outputs,
                      env_per_command=[{settings.AGENT: str(node)} for node in range(config.nnodes)],
                      world_size=config.nproc_per_node * config.nnodes, scheduler=scheduler)
