"""Slurm as a launcher: a multi-task ``srun`` step is an existing launch, one rank per task.

Inside ``srun -n N`` (N > 1) every task runs ``ddpdoctor check`` and is one rank: the rank is
``SLURM_PROCID``, the world size ``SLURM_STEP_NUM_TASKS``, the local rank ``SLURM_LOCALID``, the
node rank ``SLURM_NODEID``, the ranks on this node come from ``SLURM_STEP_TASKS_PER_NODE``
(Slurm's compressed form, ``2(x3),1``), the master address is the first host of
``SLURM_STEP_NODELIST`` (hostlist syntax, ``gpu-[001-004,010]``, expanded here without
``scontrol``) and the port is derived from the job id unless ``MASTER_PORT`` is set. These are
exported to the script as RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so ``init_process_group()`` with ``env://`` works, as under Lightning's SLURM
environment. A single-task step (``srun -n 1``, a shell from ``salloc``, the batch script itself)
is no launch: ddpdoctor starts the ranks itself there. Variables a launcher already set win
(``srun torchrun ... -m ddpdoctor check``, one torchrun per node, keeps working).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

__all__ = ["SlurmStep", "detect", "expand_hostlist", "job", "parse_tasks_per_node", "port_for_job"]

_RANGE = re.compile(r"\[([^\]]*)\]")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
PORT_BASE = 15000  # as Lightning's SLURMEnvironment: 15000 + the job id's last 4 digits


def _split_top_level(spec: str) -> list[str]:
    """``a[1,2],b`` -> ``["a[1,2]", "b"]``: commas (or whitespace) outside brackets separate hosts."""
    parts, depth, current = [], 0, []
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {spec!r}")
        if (char == "," or char.isspace()) and depth == 0:
            if current:
                parts.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {spec!r}")
    if current:
        parts.append("".join(current))
    return parts


def _numbers(ranges: str) -> list[str]:
    """``001-004,010`` -> ``["001", "002", "003", "004", "010"]`` (zero padding kept)."""
    out = []
    for item in ranges.split(","):
        item = item.strip()
        if not item:
            continue
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"not a numeric range: {item!r}")
        if not sep:
            out.append(low)
            continue
        width = len(low) if low.startswith("0") or len(low) == len(high) else 0
        if int(high) < int(low):
            raise ValueError(f"descending range: {item!r}")
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's hostlist syntax, in order: ``tux[0-2,12]`` -> tux0 tux1 tux2 tux12; several bracketed
    ranges multiply (``rack[0-1]_blade[0-2]``); commas outside brackets separate entries."""
    hosts: list[str] = []
    for entry in _split_top_level(spec.strip()):
        pieces = _RANGE.split(entry)  # literal, ranges, literal, ranges, ..., literal
        choices = [[piece] if i % 2 == 0 else _numbers(piece) for i, piece in enumerate(pieces)]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def parse_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed task counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS.match(item.strip())
        if not match:
            raise ValueError(f"not a Slurm tasks-per-node list: {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def port_for_job(job_id: str) -> int:
    """A port every task of the job derives alike: 15000 + the job id's last four digits."""
    digits = "".join(c for c in job_id if c.isdigit())[-4:]
    return PORT_BASE + int(digits or 0)


@dataclass(frozen=True)
class SlurmStep:
    """This task of a multi-task Slurm step, as a rank."""

    job_id: str
    step_id: str
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    local_world_size: int
    nodes: list[str] = field(default_factory=list)
    node_name: str = ""
    master_addr: str = ""
    master_port: int = 0

    def variables(self) -> dict[str, str]:
        """What torch's env:// and ddpdoctor read, as this task's launcher would have set them."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


def detect(env: Mapping[str, str]) -> Optional[SlurmStep]:
    """This process as a rank of an ``srun`` step of more than one task, else None."""
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return None  # not inside srun: a batch script or an salloc shell is one process, not a rank
    try:
        world_size = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        if world_size < 2:
            return None
        rank = int(env["SLURM_PROCID"])
        node_rank = int(env.get("SLURM_NODEID") or 0)
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        per_node = parse_tasks_per_node(spec) if spec else []
    except ValueError as exc:
        raise ValueError(f"cannot read this Slurm step's variables: {exc}") from None
    local_world_size = per_node[node_rank] if node_rank < len(per_node) else \
        int(env.get("SLURM_NTASKS_PER_NODE") or world_size)
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
    return SlurmStep(
        job_id=job_id, step_id=env.get("SLURM_STEP_ID", ""), rank=rank, world_size=world_size,
        local_rank=int(env.get("SLURM_LOCALID") or 0), node_rank=node_rank, local_world_size=local_world_size,
        nodes=nodes, node_name=env.get("SLURMD_NODENAME", ""),
        master_addr=env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT") or port_for_job(job_id)))


def job(env: Mapping[str, str]) -> Optional[dict]:
    """The Slurm job and step this process runs in, for the report (any launch mode), else None."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    try:
        nodes = expand_hostlist(nodelist)
    except ValueError:
        nodes = [nodelist] if nodelist else []
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return {"name": "slurm", "job_id": job_id, "step_id": env.get("SLURM_STEP_ID"), "nodes": nodes,
            "num_tasks": int(tasks) if tasks and tasks.isdigit() else None,
            "cluster": env.get("SLURM_CLUSTER_NAME"), "partition": env.get("SLURM_JOB_PARTITION")}
