"""Which training framework built a DDP module, read from the stack that constructs it.

The Hugging Face Trainer (through Accelerate), Accelerate (`Accelerator.prepare`), Lightning's
Trainer (its DDP strategy) and Lightning Fabric (`Fabric.setup`) each construct
DistributedDataParallel from their own code, so the frames on the
stack at that moment name the framework without importing or patching it. Fixes can then use the
framework's own words (`accelerator.save`, `strategy="ddp_find_unused_parameters_true"`...).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Optional

# (path fragment of the framework's own files, framework, module holding __version__), most specific first
_MARKERS = (
    ("/transformers/trainer", "transformers", "transformers"),  # the HF Trainer (TRL's trainers subclass it)
    ("/accelerate/", "accelerate", "accelerate"),
    ("/lightning/pytorch/", "lightning", "lightning"),
    ("/pytorch_lightning/", "lightning", "pytorch_lightning"),
    ("/lightning/fabric/", "fabric", "lightning"),
    ("/lightning_fabric/", "fabric", "lightning_fabric"),
)


def framework_of(frame: Optional[FrameType]) -> tuple[Optional[str], Optional[str]]:
    """(framework, its version) whose code is on the stack of ``frame``, or (None, None)."""
    found: set[str] = set()
    modules: dict[str, str] = {}
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        for fragment, name, module in _MARKERS:
            if fragment in path:
                found.add(name)
                modules.setdefault(name, module)
        frame = frame.f_back
    # The HF Trainer sets DDP up through Accelerate, Lightning's Trainer runs Fabric-style code: the outer one names it.
    for name in ("transformers", "accelerate", "lightning", "fabric"):
        if name in found:
            version = getattr(sys.modules.get(modules[name]), "__version__", None)
            return name, str(version) if version else None
    return None, None
