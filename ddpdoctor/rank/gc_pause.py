"""Pause Python's cyclic garbage collector while torch imports, and freeze what torch's import made.

Importing torch, and torch._dynamo (which DistributedDataParallel's constructor imports), creates
hundreds of thousands of objects that live as long as the process. The generational collector sees
them pile up and scans them again and again: a fifth of the import's CPU time, 0.25-0.3 s per rank
on a 2-core machine, which plain torchrun pays too. Paused for the import, it has nothing to find
there (modules, functions and classes are not garbage); it runs again as before once the import
returns, and a collector the script turned off stays off.

Those objects are scanned again by every full collection while the script runs, and by the ones
Python runs as the process exits: 0.3-0.5 CPU s per process at exit. ``gc.freeze()`` moves them to
the collector's permanent generation, as CPython documents for long-lived objects, so no collection
scans them again. It is done once torch's own import completes, when the script has made nothing of
its own yet but its imports; never later (the DDP constructor's import of torch._dynamo is not
frozen), where it would keep the script's models and tensors from ever being collected in a cycle.
Reference counting still frees frozen objects.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused"]


@contextmanager
def gc_paused(*, freeze: bool = False) -> Iterator[None]:
    """Within the block, no automatic collection runs; ``gc.collect()`` still works. With ``freeze``,
    every object alive when the block completes moves to the permanent generation (not when it
    raises: a failed import is left as it was)."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
        if freeze:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()
