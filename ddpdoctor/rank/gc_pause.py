"""Pause Python's cyclic garbage collector while torch imports.

Importing torch, and torch._dynamo (which DistributedDataParallel's constructor imports), creates
hundreds of thousands of objects that live as long as the process. The generational collector sees
them pile up and scans them again and again: a fifth of the import's CPU time, 0.25-0.3 s per rank
on a 2-core machine, which plain torchrun pays too. Paused for the import, it has nothing to find
there (modules, functions and classes are not garbage); it runs again as before once the import
returns, and a collector the script turned off stays off.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Within the block, no automatic collection runs; ``gc.collect()`` still works."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
