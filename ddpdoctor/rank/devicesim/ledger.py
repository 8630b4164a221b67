"""What the device simulation stood in for, counted per process and written as evidence.

A cumulative :class:`DeviceSimulation` event is written when simulation is decided, whenever a new
kind of call is simulated, and at exit: a crash or a hang keeps what was simulated up to then,
and the steady state costs one dict update per simulated call.
"""

from __future__ import annotations

import threading
from typing import Optional

from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import DeviceSimulation

# Names of what was simulated, as the report lists them.
NCCL = "nccl->gloo"
TENSORS = "cuda tensors->cpu"
MODULES = "cuda modules->cpu"
MAP_LOCATION = "torch.load map_location->cpu"
DDP_DEVICE_IDS = "DDP device_ids->cpu"
PIN_MEMORY = "pin_memory->no-op"
GENERATORS = "torch.Generator(cuda)->cpu"
DATA_PARALLEL = "DataParallel->module on cpu"


class Ledger:
    """Counts of simulated calls (``count``), unsupported calls and the CUDA devices asked for."""

    def __init__(self, rec: Optional[Recorder], *, mode: str, active: bool, reason: str = "") -> None:
        self.rec = rec
        self.mode = mode
        self.active = active
        self.reason = reason
        self.calls: dict[str, int] = {}
        self.unsupported: list[str] = []
        self.ignored: list[str] = []
        self.devices: set[int] = set()
        self._lock = threading.Lock()

    def count(self, what: str) -> None:
        calls = self.calls
        if what in calls:
            calls[what] += 1
            return
        with self._lock:
            calls[what] = calls.get(what, 0) + 1
        self.emit()

    def device(self, index: int) -> None:
        if index not in self.devices:
            self.devices.add(index)
            self.emit()

    def not_simulated(self, what: str, *, ignored: bool = False) -> None:
        """A call that cannot run on CPU: it raised in the script (or, ``ignored``, did nothing)."""
        target = self.ignored if ignored else self.unsupported
        if what not in target:
            target.append(what)
            self.emit()

    def event(self) -> DeviceSimulation:
        return DeviceSimulation(mode=self.mode, active=self.active, reason=self.reason, calls=dict(self.calls),
                                unsupported=list(self.unsupported), ignored=list(self.ignored),
                                devices=sorted(self.devices))

    def emit(self) -> None:
        if self.rec is not None:
            with self.rec.guard("device", "DeviceSimulation"):
                self.rec.emit(self.event())
