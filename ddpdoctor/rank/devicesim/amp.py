"""Mixed precision written for CUDA, on the CPU.

``autocast("cuda", dtype)`` becomes CPU autocast (float16 -> bfloat16, the CPU's fast type), so
the script still runs its forward under autocast. ``GradScaler("cuda")`` becomes a disabled
scaler, exactly what torch builds with ``enabled=False``: ``scale()`` returns the loss unchanged,
``step()`` calls ``optimizer.step()``, ``update()`` does nothing. bfloat16 needs no loss scaling.
"""

from __future__ import annotations

import inspect

import torch
from torch.amp.autocast_mode import autocast
from torch.amp.grad_scaler import GradScaler

from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder

PROBE = "device"
AUTOCAST = "autocast(cuda)->autocast(cpu, bfloat16)"
GRAD_SCALER = "GradScaler(cuda)->disabled"


def install(rec: Recorder, ledger: Ledger) -> None:
    def wrap_autocast(original):
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                ledger.count(AUTOCAST)
                device_type = "cpu"
                if dtype is None or dtype == torch.float16:
                    dtype = torch.bfloat16
            return original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        return __init__

    signature = inspect.signature(GradScaler.__init__)

    def wrap_scaler(original):
        def __init__(self, *args, **kwargs):
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                return original(self, *args, **kwargs)
            bound.apply_defaults()
            if bound.arguments.get("device") == "cuda" and bound.arguments.get("enabled"):
                ledger.count(GRAD_SCALER)
                bound.arguments["enabled"] = False
            return original(*bound.args, **bound.kwargs)

        return __init__

    patch(rec, PROBE, autocast, "__init__", wrap_autocast)
    patch(rec, PROBE, GradScaler, "__init__", wrap_scaler)
