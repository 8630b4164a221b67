"""How many GPUs this node gives a job, without importing torch (the supervisor never does).

The reference job runs one rank per GPU by default. The count comes from the NVIDIA driver's
/proc/driver/nvidia/gpus (one directory per GPU), else `nvidia-smi -L` with a short timeout, then
CUDA_VISIBLE_DEVICES narrows it as CUDA would: the listed entries up to the first invalid one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping, Optional

_PROC_GPUS = "/proc/driver/nvidia/gpus"


def physical_gpus(proc_dir: str = _PROC_GPUS) -> int:
    """GPUs the driver knows on this node (0 without an NVIDIA driver)."""
    try:
        return len([entry for entry in os.listdir(proc_dir) if not entry.startswith(".")])
    except OSError:
        pass
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def visible_gpus(physical: int, cuda_visible_devices: Optional[str]) -> int:
    """GPUs a process sees under CUDA_VISIBLE_DEVICES: entries up to the first invalid one (as CUDA
    reads it: an index past the GPUs, or a negative one, ends the list; UUID/MIG entries count)."""
    if cuda_visible_devices is None:
        return physical
    count = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            if not 0 <= int(entry) < physical:
                break
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        count += 1
    return min(count, physical) if physical else 0


def local_gpu_count(env: Mapping[str, str] = os.environ) -> int:
    """GPUs a rank started on this node would see."""
    physical = physical_gpus()
    return visible_gpus(physical, env.get("CUDA_VISIBLE_DEVICES")) if physical else 0
