"""``torch.cuda`` and ``torch.accelerator`` answering as one simulated GPU per rank.

``device_count()`` is the ranks per node (LOCAL_WORLD_SIZE; in an mp.spawn launcher, before any
worker exists, the configured --nproc-per-node), so ``mp.spawn(..., nprocs=device_count())`` starts
the job ddpdoctor was asked for. Memory and timing answers are harmless constants or CPU clocks.
What has no CPU meaning (CUDA graphs, torch.cuda.nccl, jiterator, anything that would initialize
the CUDA runtime) raises :class:`NotSimulatedError` naming the API.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Optional

import torch

from ddpdoctor.rank.devicesim.errors import NotSimulatedError, NotSimulatedModule, raiser
from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.devicesim.mode import is_cuda
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder

DEVICE_NAME = "ddpdoctor simulated GPU (CPU)"
TOTAL_MEMORY = 80 * 1024 ** 3


def local_device_count(nproc_per_node: Optional[int]) -> int:
    """GPUs a simulated node has: one per local rank."""
    for value in (os.environ.get("LOCAL_WORLD_SIZE"), nproc_per_node):
        try:
            if value is not None and int(value) > 0:
                return int(value)
        except ValueError:
            continue
    return 1


class SimulatedDevices:
    """The process's simulated CUDA state: the device count and the current device."""

    def __init__(self, ledger: Ledger, count: int) -> None:
        self.ledger = ledger
        self.count = count
        self.current = 0

    def index(self, device: Any, api: str) -> int:
        if device is None:
            return self.current
        if isinstance(device, str) and device == "cuda":
            return self.current
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"{api}: expected a CUDA device, got {device}")
            return self.current if device.index is None else device.index
        index = int(str(device).split(":", 1)[1]) if isinstance(device, str) else int(device)
        return index

    def set_device(self, device: Any, api: str = "torch.cuda.set_device") -> None:
        index = self.index(device, api)
        if not 0 <= index < self.count:
            # torch's own words, so analysis decodes it like the real "invalid device ordinal"
            raise RuntimeError(f"CUDA error: invalid device ordinal (simulated: {api}({index}) with "
                               f"{self.count} simulated GPUs on this node)")
        self.current = index
        self.ledger.device(index)


class SimulatedEvent:
    """torch.cuda.Event on the CPU clock: record() stamps the time; elapsed_time() is in ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 **_kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self._t: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: "SimulatedEvent") -> float:
        if self._t is None or end_event._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event._t - self._t) * 1000.0


class SimulatedStream:
    """torch.cuda.Stream: CPU work is already ordered, so every method is a no-op."""

    def __init__(self, device: Any = None, priority: int = 0, **_kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> SimulatedEvent:
        event = event or SimulatedEvent()
        event.record()
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> "SimulatedStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def install(rec: Recorder, ledger: Ledger, *, nproc_per_node: Optional[int]) -> SimulatedDevices:
    """Patch torch.cuda and torch.accelerator (restored by patching.restore_all)."""
    devices = SimulatedDevices(ledger, local_device_count(nproc_per_node))
    cuda = torch.cuda

    counted = _counter(ledger)

    def properties(device: Any = None) -> SimpleNamespace:
        return SimpleNamespace(name=DEVICE_NAME, total_memory=TOTAL_MEMORY, major=8, minor=0, multi_processor_count=1,
                               is_integrated=False, is_multi_gpu_board=False, uuid="ddpdoctor-simulated",
                               L2_cache_size=0, warp_size=32, gcnArchName="")

    class SimulatedDeviceContext:
        """``with torch.cuda.device(n):`` / ``torch.accelerator.device_index(n)``."""

        def __init__(self, device: Any) -> None:
            self.index = None if device is None else devices.index(device, "torch.cuda.device")
            self.previous = devices.current

        def __enter__(self) -> "SimulatedDeviceContext":
            self.previous = devices.current
            if self.index is not None and 0 <= self.index < devices.count:
                devices.current = self.index
            return self

        def __exit__(self, *exc: Any) -> None:
            devices.current = self.previous

    rng = {"get_rng_state": lambda device="cuda": torch.get_rng_state(),
           "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(devices.count)],
           "set_rng_state": _nothing, "set_rng_state_all": _nothing,
           "manual_seed": _nothing, "manual_seed_all": _nothing, "seed": _nothing, "seed_all": _nothing,
           "initial_seed": lambda: torch.initial_seed()}
    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": counted("torch.cuda.device_count", lambda: devices.count),
        "current_device": lambda: devices.current,
        "set_device": counted("torch.cuda.set_device", lambda device: devices.set_device(device)),
        "device": SimulatedDeviceContext,
        "synchronize": counted("torch.cuda.synchronize", _nothing),
        "get_device_name": lambda device=None: DEVICE_NAME,
        "get_device_capability": lambda device=None: (8, 0),
        "get_device_properties": properties,
        "get_arch_list": lambda: [],
        "is_bf16_supported": lambda including_emulation=True: True,
        "memory_allocated": _zero, "max_memory_allocated": _zero, "memory_reserved": _zero,
        "max_memory_reserved": _zero, "memory_cached": _zero, "max_memory_cached": _zero,
        "reset_peak_memory_stats": _nothing, "reset_max_memory_allocated": _nothing,
        "reset_max_memory_cached": _nothing, "reset_accumulated_memory_stats": _nothing,
        "empty_cache": _nothing, "ipc_collect": _nothing, "set_per_process_memory_fraction": _nothing,
        "memory_stats": lambda device=None: {}, "memory_summary": lambda device=None, abbreviated=False: "",
        "mem_get_info": lambda device=None: (TOTAL_MEMORY, TOTAL_MEMORY),
        "Event": SimulatedEvent, "Stream": SimulatedStream,
        "current_stream": lambda device=None: SimulatedStream(), "default_stream": lambda device=None: SimulatedStream(),
        "stream": lambda stream=None: contextlib.nullcontext(stream), "set_stream": _nothing,
        "is_current_stream_capturing": lambda: False,
        **rng,  # not counted: torch.manual_seed itself calls torch.cuda.manual_seed_all
    }
    for name, value in answers.items():
        _replace(rec, cuda, name, value)
    for name in ("range_push", "range_pop", "mark"):
        _replace(rec, cuda.nvtx, name, _zero)
    _replace(rec, cuda.nvtx, "range", lambda *a, **k: contextlib.nullcontext())
    _replace(rec, cuda.memory, "mem_get_info", answers["mem_get_info"])

    ignored = lambda api: lambda *a, **k: ledger.not_simulated(api, ignored=True)  # noqa: E731
    for name in ("_record_memory_history", "_dump_snapshot"):
        _replace(rec, cuda.memory, name, ignored(f"torch.cuda.memory.{name}"))
    note = ledger.not_simulated
    for name in ("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle", "caching_allocator_alloc",
                 "set_sync_debug_mode", "ExternalStream"):
        _replace(rec, cuda, name, raiser(f"torch.cuda.{name}", note))
    for name in ("nccl", "jiterator"):
        _replace(rec, cuda, name, NotSimulatedModule(f"torch.cuda.{name}", note))
    for owner in (cuda, sys.modules.get("torch.cuda.memory"), sys.modules.get("torch.cuda.random")):
        if owner is not None:
            _replace(rec, owner, "_lazy_init", _lazy_init_raiser(note))
    _install_accelerator(rec, ledger, devices, SimulatedDeviceContext)
    return devices


def _install_accelerator(rec: Recorder, ledger: Ledger, devices: SimulatedDevices, context: type) -> None:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return

    count_and = _counter(ledger)
    set_index = count_and("torch.accelerator.set_device_index",
                          lambda device: devices.set_device(device, "torch.accelerator.set_device_index"))
    answers = {
        "is_available": lambda: True,
        "current_accelerator": count_and("torch.accelerator.current_accelerator",
                                         lambda check_available=False: torch.device("cuda")),
        "device_count": count_and("torch.accelerator.device_count", lambda: devices.count),
        "set_device_index": set_index, "set_device_idx": set_index,
        "current_device_index": lambda: devices.current, "current_device_idx": lambda: devices.current,
        "synchronize": count_and("torch.accelerator.synchronize", _nothing),
        "device_index": context,
        "current_stream": lambda device=None: SimulatedStream(), "set_stream": _nothing,
        "empty_cache": _nothing, "memory_allocated": _zero, "max_memory_allocated": _zero,
        "memory_reserved": _zero, "max_memory_reserved": _zero, "reset_peak_memory_stats": _nothing,
        "reset_accumulated_memory_stats": _nothing, "memory_stats": lambda device=None: {},
        "get_memory_info": lambda device=None: (TOTAL_MEMORY, TOTAL_MEMORY),
    }
    for name, value in answers.items():
        _replace(rec, accelerator, name, value)


def _counter(ledger: Ledger) -> Any:
    """``counted(api, fn)``: ``fn``, counted as ``api`` when the script called it (not torch itself,
    e.g. the DataLoader asking for the current accelerator, nor another probe)."""

    def counted(api: str, fn: Any) -> Any:
        def simulated(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith(("torch.", "ddpdoctor.")):
                ledger.count(api)
            return fn(*args, **kwargs)

        return simulated

    return counted


def _lazy_init_raiser(note: Any) -> Any:
    """torch.cuda's lazy CUDA initialization, reached by any torch.cuda API not simulated here."""

    def _lazy_init() -> None:
        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "torch.cuda")
        api = f"{module}.{caller.f_code.co_name}"
        note(api)
        raise NotSimulatedError(api)

    return _lazy_init


def _replace(rec: Recorder, owner: Any, name: str, value: Any) -> None:
    """Patch ``owner.name`` with ``value`` where this torch version has the attribute."""
    if getattr(owner, name, None) is None:
        return
    if value is _nothing or value is _zero:  # a fresh function per attribute: patch() stamps its wrapper
        shared = value

        def value(*args: Any, **kwargs: Any) -> Any:
            return shared(*args, **kwargs)

    patch(rec, "device", owner, name, lambda _original: value)


__all__ = ["SimulatedDevices", "SimulatedEvent", "SimulatedStream", "install", "local_device_count", "is_cuda"]
