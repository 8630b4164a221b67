"""An explicit CPU choice of the launcher or framework, which ``--device auto`` respects.

``accelerate launch --cpu``, Lightning's ``accelerator="cpu"`` given through its environment, or
CUDA_VISIBLE_DEVICES set to no device say "run on the CPU". Under them a script takes its CPU
path with plain torchrun; a simulated GPU would send it down its GPU path instead, so in ``auto``
the simulation stays off and the report says which setting turned it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

_TRUE = ("y", "yes", "t", "true", "on", "1")  # accelerate's str_to_bool

# variable -> (its values that choose the CPU, who sets it)
_ACCELERATORS = {
    "ACCELERATE_USE_CPU": (_TRUE, "accelerate launch --cpu"),
    "PL_TRAINER_ACCELERATOR": (("cpu",), "Lightning Trainer(accelerator=\"cpu\")"),
    "LT_ACCELERATOR": (("cpu",), "lightning run --accelerator cpu"),
    "DS_ACCELERATOR": (("cpu",), "DeepSpeed's CPU accelerator"),
}


@dataclass(frozen=True)
class Decision:
    """Whether a process simulates CUDA (``active``) in ``mode``, and why."""

    mode: str
    active: bool
    reason: str


def cpu_choice(env: Mapping[str, str]) -> Optional[str]:
    """Why ``env`` chose the CPU (the setting and its meaning), or None."""
    for name, (values, origin) in _ACCELERATORS.items():
        value = env.get(name)
        if value is not None and value.strip().lower() in values:
            return f"{name}={value} ({origin}) chose the CPU"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and _no_device(visible):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    return None


def _no_device(visible: str) -> bool:
    """CUDA_VISIBLE_DEVICES that hides every GPU: empty, or a negative index first (CUDA ignores
    the list from the first invalid entry on)."""
    first = visible.split(",")[0].strip()
    return first == "" or first.startswith("-")
