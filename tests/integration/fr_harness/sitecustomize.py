"""Loaded by every Python process with this folder on PYTHONPATH: inside a torchrun rank
(RANK set) with TORCH_FR_DUMP_TEMP_FILE set, start the flight recorder dump harness."""

import os

if os.environ.get("TORCH_FR_DUMP_TEMP_FILE") and os.environ.get("RANK") is not None:
    import fr_harness

    fr_harness.start()
