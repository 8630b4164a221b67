"""Device simulation: a script written for GPUs (NCCL, CUDA tensors, torch.cuda/torch.accelerator,
generators, streams, autocast, GradScaler, SyncBatchNorm) runs on CPU ranks with gloo, so its DDP
bugs show on a CPU-only machine (CI) instead of one "CUDA is not available" crash.

Modes (``--device``): ``auto`` simulates where this process sees no GPU and neither the launcher
nor the framework chose the CPU (choice.py), ``simulate`` (alias ``cpu``) always, ``native`` never.
Installed under every other probe (their patches wrap these), so the probes record the script's
own arguments; everything is undone by ``patching.restore_all`` and :func:`install`'s finalizer.
What was simulated, and why the simulation is on or off, is written as ``DeviceSimulation``
evidence (see ledger.py).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional

from ddpdoctor.rank.devicesim.choice import Decision, cpu_choice
from ddpdoctor.rank.devicesim.errors import MARKER, NotSimulatedError
from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import DEVICE_ALIASES, DEVICE_MODES, GPU_VISIBLE, device_mode

__all__ = ["MODES", "ALIASES", "MARKER", "NotSimulatedError", "Ledger", "Decision", "decide", "should_simulate",
           "install"]

MODES = DEVICE_MODES
ALIASES = DEVICE_ALIASES


def decide(mode: str, env: Optional[Mapping[str, str]] = None) -> Decision:
    """Whether this process simulates CUDA, and why (ValueError for an unknown mode)."""
    mode = device_mode(mode)
    if mode == "native":
        return Decision(mode, False, "--device native")
    if mode == "simulate":
        return Decision(mode, True, "--device simulate")
    choice = cpu_choice(os.environ if env is None else env)
    if choice is not None:
        return Decision(mode, False, choice)
    import torch

    if torch.cuda.is_available():
        return Decision(mode, False, GPU_VISIBLE)
    return Decision(mode, True, "no GPU visible")


def should_simulate(mode: str) -> bool:
    return decide(mode).active


def install(rec: Optional[Recorder], *, mode: str = "auto", nproc_per_node: Optional[int] = None) -> Callable[[], None]:
    """Install the simulation if ``mode`` asks for it; returns the finalizer (pops the mode, writes
    the final counts). The patches themselves are undone by ``patching.restore_all``."""
    decision = decide(mode)
    ledger = Ledger(rec, mode=decision.mode, active=decision.active, reason=decision.reason)
    ledger.emit()
    if not decision.active:
        return ledger.emit
    from ddpdoctor.rank.devicesim import amp, cuda_api, distributed, syncbn
    from ddpdoctor.rank.devicesim.mode import (CpuDeviceMode, wrap_load, wrap_map_fetch, wrap_pin_memory,
                                               wrap_profile_hook_step, wrap_zero_grad)
    from ddpdoctor.rank.probes.patching import patch

    import torch
    import torch.utils.data._utils.fetch as fetch_module
    import torch.utils.data._utils.pin_memory as pin_memory_module

    devices = cuda_api.install(rec, ledger, nproc_per_node=nproc_per_node)
    stop_waiting_for_fsdp = distributed.install(rec, ledger)
    amp.install(rec, ledger)
    syncbn.install(rec, ledger)
    for owner in (torch, torch.serialization):
        patch(rec, "device", owner, "load", wrap_load(ledger))
    patch(rec, "device", pin_memory_module, "pin_memory", wrap_pin_memory(ledger))
    cpu_mode = CpuDeviceMode(ledger, lambda: devices.count)
    patch(rec, "device", torch.optim.Optimizer, "profile_hook_step", wrap_profile_hook_step(cpu_mode))
    patch(rec, "device", torch.optim.Optimizer, "zero_grad", wrap_zero_grad(cpu_mode))
    patch(rec, "device", fetch_module._MapDatasetFetcher, "fetch", wrap_map_fetch(cpu_mode))
    cpu_mode.__enter__()

    def finish() -> None:
        try:
            stop_waiting_for_fsdp()
            cpu_mode.__exit__(None, None, None)
        finally:
            ledger.emit()

    return finish
