"""Probe: what every rank runs on (``ddpdoctor env``, the env-consistency check).

At start-up: versions, driver, host and the variables that steer a distributed job. Nothing here
initializes CUDA: ``torch.cuda.is_available()`` calls cuInit, after which a forked child can no
longer use CUDA, so the GPUs themselves are read only at the end, and only if the script
initialized CUDA itself (then they are the GPUs it used).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Callable, Optional

import torch

from ddpdoctor.rank import publish
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import RankDevices, RankEnvironment

PROBE = "environment"

VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
             "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME", "TORCH_DISTRIBUTED_DEBUG", "PYTORCH_CUDA_ALLOC_CONF",
             "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
             "SLURM_JOB_NODELIST", "SLURMD_NODENAME")
PREFIXES = ("NCCL_", "TORCH_NCCL_")
_DRIVER_FILE = "/proc/driver/nvidia/version"


def relevant_variables(env: Optional[dict] = None) -> dict[str, str]:
    """The launcher's, NCCL's and CUDA's variables (never the rest of the environment)."""
    env = os.environ if env is None else env
    return {k: env[k] for k in sorted(env) if k in VARIABLES or k.startswith(PREFIXES)}


def driver_from_proc(text: str) -> Optional[str]:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug ...' -> '535.104.05'."""
    for line in text.splitlines():
        if "Kernel Module" in line:
            words = line.split("Kernel Module", 1)[1].split()
            return words[0] if words else None
    return None


def _driver_version() -> Optional[str]:
    try:
        with open(_DRIVER_FILE) as f:
            return driver_from_proc(f.read())
    except OSError:
        return None


def _nccl_version() -> Optional[str]:
    if torch.version.cuda is None:
        return None
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _cudnn_version() -> Optional[int]:
    if torch.version.cuda is None:
        return None
    try:
        return torch.backends.cudnn.version()
    except Exception:
        return None


def _gpu(index: int) -> Optional[dict]:
    """One visible GPU; None for a stand-in of ddpdoctor's --device simulation (not torch's own type)."""
    props = torch.cuda.get_device_properties(index)
    real_type = getattr(torch._C, "_CudaDeviceProperties", None)
    if real_type is None or not isinstance(props, real_type):
        return None
    uuid = getattr(props, "uuid", None)
    bus = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    return {"index": index, "name": props.name, "memory_bytes": int(props.total_memory),
            "uuid": str(uuid) if uuid is not None else None,
            "pci_bus_id": f"{bus[0]:04x}:{bus[1]:02x}:{bus[2]:02x}.0" if None not in bus else None}


def _smi_driver() -> Optional[str]:
    """The driver from nvidia-smi, where /proc/driver/nvidia is not mounted (some containers)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def record_devices(rec: Recorder) -> None:
    """The visible GPUs and the current one, if the script initialized CUDA (never initializes it)."""
    if torch.version.cuda is None or not torch.cuda.is_initialized():  # a CPU build's GPUs are simulated
        return
    gpus = [_gpu(i) for i in range(torch.cuda.device_count())]
    if None in gpus:
        return
    rec.emit(RankDevices(gpus=gpus, current_device=torch.cuda.current_device(),
                         driver_version=None if _driver_version() else _smi_driver()))


def install(rec: Recorder) -> Callable[[], None]:
    publish.set_recorder(rec)
    rec.emit(RankEnvironment(
        host=rec.host, pid=rec.pid, local_rank=rec.local_rank, node_rank=rec.node_rank,
        python_version=platform.python_version(), torch_version=str(torch.__version__), platform=platform.platform(),
        cuda_version=torch.version.cuda, cudnn_version=_cudnn_version(), nccl_version=_nccl_version(),
        driver_version=_driver_version(), variables=relevant_variables()))

    def finish() -> None:
        try:
            with rec.guard(PROBE, "devices"):
                record_devices(rec)
        finally:
            publish.set_recorder(None)

    return finish
