"""Device simulation: a script written for GPUs (NCCL, CUDA tensors, torch.cuda/torch.accelerator,
autocast, GradScaler, SyncBatchNorm) runs on CPU ranks with gloo, so its DDP bugs show on a CPU-only
machine (CI) instead of one "CUDA is not available" crash.

Modes (``--device``): ``auto`` simulates where this process sees no GPU, ``cpu`` always, ``native``
never. Installed under every other probe (their patches wrap these), so the probes record the
script's own arguments; everything is undone by ``patching.restore_all`` and :func:`uninstall`.
What was simulated is written as ``DeviceSimulation`` evidence (see ledger.py).
"""

from __future__ import annotations

from typing import Callable, Optional

from ddpdoctor.rank.devicesim.errors import MARKER, NotSimulatedError
from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.recorder import Recorder

__all__ = ["MODES", "MARKER", "NotSimulatedError", "Ledger", "should_simulate", "install"]

MODES = ("auto", "cpu", "native")


def should_simulate(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"device mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "native":
        return False
    if mode == "cpu":
        return True
    import torch

    return not torch.cuda.is_available()


def install(rec: Optional[Recorder], *, mode: str = "auto", nproc_per_node: Optional[int] = None) -> Callable[[], None]:
    """Install the simulation if ``mode`` asks for it; returns the finalizer (pops the mode, writes
    the final counts). The patches themselves are undone by ``patching.restore_all``."""
    active = should_simulate(mode)
    ledger = Ledger(rec, mode=mode, active=active)
    ledger.emit()
    if not active:
        return ledger.emit
    from ddpdoctor.rank.devicesim import amp, cuda_api, distributed, syncbn
    from ddpdoctor.rank.devicesim.mode import CpuDeviceMode, wrap_load, wrap_pin_memory
    from ddpdoctor.rank.probes.patching import patch

    import torch
    import torch.utils.data._utils.pin_memory as pin_memory_module

    cuda_api.install(rec, ledger, nproc_per_node=nproc_per_node)
    distributed.install(rec, ledger)
    amp.install(rec, ledger)
    syncbn.install(rec, ledger)
    for owner in (torch, torch.serialization):
        patch(rec, "device", owner, "load", wrap_load(ledger))
    patch(rec, "device", pin_memory_module, "pin_memory", wrap_pin_memory(ledger))
    device_mode = CpuDeviceMode(ledger)
    device_mode.__enter__()

    def finish() -> None:
        try:
            device_mode.__exit__(None, None, None)
        finally:
            ledger.emit()

    return finish
