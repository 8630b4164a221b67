"""This machine as a bug report describes it: OS, CPU, memory, Python and the packages that matter
for a DDP job. Standard library only (the supervisor side never imports torch); the ranks report
torch, CUDA, cuDNN, NCCL and the GPUs themselves (``ddpdoctor env``)."""

from __future__ import annotations

import os
import platform
from importlib import metadata

__all__ = ["PACKAGES", "local_system"]

# Distributions whose versions change how a DDP job behaves, in the order a report lists them.
PACKAGES = ("ddpdoctor", "torch", "torchvision", "numpy", "triton", "accelerate", "lightning", "pytorch-lightning",
            "deepspeed", "transformers", "torchdata", "nvidia-nccl-cu11", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "nvidia-cudnn-cu12", "nvidia-cuda-runtime-cu12")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return round(pages * page_size / 2**30, 1)


def local_system() -> dict:
    """{os, cpu, cpus, memory_gib, python, packages: {name: version}} of this machine."""
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"os": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(), "memory_gib": _memory_gib(),
            "python": platform.python_version(), "packages": packages}
