"""Probe code runs with torch functions' overrides off: no mode, no subclass ``__torch_function__``.

Every torch call made on a thread goes through the torch function modes pushed on it: the device
simulation's CpuDeviceMode (on by default on a machine without a GPU), and any of the script's own
(``with torch.device(...)``, a profiler's). The probes' calls went through them too: a fingerprinted
step made about 800 of them (the word views of each tensor, their sums, the loss probe's samples), at
0.7 µs each under the simulation's mode against 0.04 µs without (tests/unit/test_torch_modes.py
checks the effect; BENCHMARKS.md, issue #34, the cost). A probe only reads tensors on their own
devices and never names a device, so no mode has anything to do with its calls, and a mode of the
script's must not change what a probe reads. A subclass's ``__torch_function__`` is skipped as
well: a probe reads a tensor's own bytes (a DTensor's local shard through ``to_local()``, which is
``__torch_dispatch__`` and stays on), not what a subclass would make of them.

Only probe code runs inside: never the script's code or a callback into it.
"""

from __future__ import annotations

from torch._C import DisableTorchFunction

__all__ = ["outside_torch_modes"]

outside_torch_modes = DisableTorchFunction  # a C++ context manager: 0.14 µs to enter and leave
