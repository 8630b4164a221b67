"""The GPUs a rank really has, for the reference job and `ddpdoctor env` (both pick NCCL on GPUs)."""

from __future__ import annotations

import torch


def real_gpu_count() -> int:
    """GPUs this process really sees (CUDA_VISIBLE_DEVICES honoured). torch.cuda.is_available() is
    the documented test, but ddpdoctor's --device simulation makes it True on a CPU-only machine,
    and a smoke test must measure real hardware: the raw CUDA runtime count decides."""
    if not torch.cuda.is_available():
        return 0
    raw = getattr(torch._C, "_cuda_getDeviceCount", None)  # absent from a CPU build: any GPU it shows is simulated
    return int(raw()) if raw is not None else 0
