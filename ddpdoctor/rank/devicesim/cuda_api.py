"""``torch.cuda`` and ``torch.accelerator`` answering as one simulated GPU per rank.

``device_count()`` is the ranks per node (LOCAL_WORLD_SIZE; in an mp.spawn launcher, before any
worker exists, the configured --nproc-per-node), so ``mp.spawn(..., nprocs=device_count())`` starts
the job ddpdoctor was asked for. Memory and timing answers are harmless constants or CPU clocks
(properties.py), streams and events are no-ops (streams.py), RNG state is kept per device (rng.py).

Every replacement keeps its kind (a class stays a class, a subclass of torch's; a function stays a
function; a module stays the module), so ``isinstance``, subclassing and ``torch.cuda.X | None``
annotations work at import. Every other public function of these modules is guarded: it runs as
torch wrote it, and where it fails for want of CUDA, its error (of the kind a CPU-only torch
raises) names the API and the ledger records it. What has no CPU meaning (CUDA graphs, memory
pools, external streams) raises that way at its first use.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import types
from typing import Any, Callable, Iterator, Optional

import torch

from ddpdoctor.rank.devicesim import properties
from ddpdoctor.rank.devicesim.errors import (CPU_BUILD_ERRORS, NOT_COMPILED, NotSimulatedError, invalid_ordinal,
                                             not_simulated, raiser)
from ddpdoctor.rank.devicesim.ledger import Ledger
from ddpdoctor.rank.devicesim.mode import is_cuda
from ddpdoctor.rank.devicesim.rng import SimulatedRng, generator_class
from ddpdoctor.rank.devicesim.streams import stream_classes
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.torch_modes import outside_torch_modes


# Modules whose public functions are simulated or guarded. Submodules re-export into torch.cuda
# (torch.cuda.memory_allocated is torch.cuda.memory.memory_allocated): a stand-in replaces one
# function object under every name it has, so the aliases stay aliases.
OWNERS = ("torch.cuda", "torch.cuda.memory", "torch.cuda.random", "torch.cuda.graphs", "torch.cuda.streams",
          "torch.cuda.nvtx", "torch.cuda.profiler", "torch.cuda.nccl", "torch.cuda.tunable", "torch.cuda.jiterator",
          "torch.accelerator", "torch.accelerator.graphs", "torch.accelerator.memory", "torch.accelerator.random")

# Legacy CUDA tensor types (torch.cuda.FloatTensor...): the CPU's, as every CUDA tensor is a CPU one here.
_LEGACY_TYPES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
                 "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")


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
        if device is None or (isinstance(device, str) and device == "cuda"):
            return self.current
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"{api}: expected a CUDA device, got {device}")
            return self.current if device.index is None else device.index
        if isinstance(device, str):
            if not device.startswith("cuda:"):
                raise ValueError(f"{api}: expected a CUDA device, got {device!r}")
            parsed = torch.device(device)  # torch's own "Invalid device string" for "cuda:-1"
            return self.current if parsed.index is None else parsed.index
        return int(device)

    def set_device(self, device: Any, api: str = "torch.cuda.set_device") -> None:
        index = self.index(device, api)
        if index < 0:
            return  # torch: a negative index is a no-op
        self.enter(index)

    def enter(self, index: int) -> None:
        """Make ``index`` current, failing past this node's GPUs as cudaSetDevice does."""
        if index >= self.count:
            raise invalid_ordinal()
        self.current = index
        self.ledger.device(index)


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def install(rec: Recorder, ledger: Ledger, *, nproc_per_node: Optional[int]) -> SimulatedDevices:
    """Patch torch.cuda, torch.accelerator and torch.Generator (restored by patching.restore_all)."""
    devices = SimulatedDevices(ledger, local_device_count(nproc_per_node))
    rng = SimulatedRng(devices)
    stand_ins = {**_cuda_answers(ledger, devices, rng), **_accelerator_answers(ledger, devices, rng)}
    unsupported = _unsupported(ledger)
    _apply(rec, ledger, {**stand_ins, **unsupported})
    for owner in ("torch.cuda", "torch.cuda.memory", "torch.cuda.random"):
        module = sys.modules.get(owner)
        if module is not None and hasattr(module, "_lazy_init"):
            _replace(rec, module, "_lazy_init", _lazy_init_raiser(ledger.not_simulated))
    _replace(rec, torch, "Generator", generator_class(ledger))
    return devices


def _cuda_answers(ledger: Ledger, devices: SimulatedDevices, rng: SimulatedRng) -> dict[str, Any]:
    """Qualified name -> stand-in, for torch.cuda and its submodules."""
    counted = _counter(ledger)
    cuda = torch.cuda

    class device(cuda.device):  # noqa: N801 (torch's name)
        """``with torch.cuda.device(n):`` on the simulated devices."""

        def __init__(self, device: Any) -> None:
            self.idx = -1 if device is None else devices.index(device, "torch.cuda.device")
            self.prev_idx = devices.current

        def __enter__(self) -> "device":
            self.prev_idx = devices.current
            if self.idx >= 0:  # torch: a negative index is a no-op
                devices.enter(self.idx)
            return self

        def __exit__(self, *exc: Any) -> bool:
            devices.current = self.prev_idx
            return False

    Stream, Event = stream_classes(devices)
    ignored = lambda api: lambda *a, **k: ledger.not_simulated(api, ignored=True)  # noqa: E731
    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": _nothing,
        "device_count": counted("torch.cuda.device_count", lambda: devices.count),
        "current_device": lambda: devices.current,
        "set_device": counted("torch.cuda.set_device", lambda device: devices.set_device(device)),
        "device": device,
        "synchronize": counted("torch.cuda.synchronize", _nothing),
        "get_device_name": lambda device=None: properties.NAME,
        "get_device_capability": lambda device=None: properties.CAPABILITY,
        "get_device_properties": lambda device=None: properties.device_properties(
            devices.index(device, "torch.cuda.get_device_properties")),
        "is_bf16_supported": lambda including_emulation=True: True,
        "is_tf32_supported": lambda: True,
        "can_device_access_peer": lambda device, peer_device: True,
        "get_allocator_backend": lambda: "native",
        "get_per_process_memory_fraction": lambda device=None: 1.0,
        "set_per_process_memory_fraction": _nothing,
        "memory_stats": properties.memory_stats,
        "memory_stats_as_nested_dict": properties.memory_stats_as_nested_dict,
        "reset_peak_memory_stats": _nothing, "reset_max_memory_allocated": _nothing,
        "reset_max_memory_cached": _nothing, "reset_accumulated_memory_stats": _nothing,
        "reset_peak_host_memory_stats": _nothing, "reset_accumulated_host_memory_stats": _nothing,
        "empty_cache": _nothing, "ipc_collect": _nothing,
        "mem_get_info": properties.mem_get_info,
        "memory_snapshot": lambda *a, **k: [],
        "Event": Event, "Stream": Stream,
        "current_stream": lambda device=None: Stream(device), "default_stream": lambda device=None: Stream(device),
        "stream": lambda stream=None: contextlib.nullcontext(stream), "set_stream": _nothing,
        "is_current_stream_capturing": lambda: False,
        "get_sync_debug_mode": _zero,
        "set_sync_debug_mode": ignored("torch.cuda.set_sync_debug_mode"),
        "memory._record_memory_history": ignored("torch.cuda.memory._record_memory_history"),
        "memory._dump_snapshot": ignored("torch.cuda.memory._dump_snapshot"),
        "profiler.start": ignored("torch.cuda.profiler.start"),
        "profiler.stop": ignored("torch.cuda.profiler.stop"),
        "nvtx.range_push": _zero, "nvtx.range_pop": _zero, "nvtx.range_start": _zero, "nvtx.range_end": _nothing,
        "nvtx.mark": _nothing, "nvtx.range": lambda *a, **k: contextlib.nullcontext(),
        **rng.answers(),  # not counted: torch.manual_seed itself calls torch.cuda.manual_seed_all
    }
    for name in _LEGACY_TYPES:
        if hasattr(torch, name):
            answers[name] = getattr(torch, name)
    return {("torch.cuda." + name): value for name, value in answers.items()}


def _accelerator_answers(ledger: Ledger, devices: SimulatedDevices, rng: SimulatedRng) -> dict[str, Any]:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return {}
    counted = _counter(ledger)
    set_index = counted("torch.accelerator.set_device_index",
                        lambda device: devices.set_device(device, "torch.accelerator.set_device_index"))
    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "current_accelerator": counted("torch.accelerator.current_accelerator",
                                       lambda check_available=False: torch.device("cuda")),
        "device_count": counted("torch.accelerator.device_count", lambda: devices.count),
        "set_device_index": set_index, "set_device_idx": set_index,
        "current_device_index": lambda: devices.current, "current_device_idx": lambda: devices.current,
        "synchronize": counted("torch.accelerator.synchronize", _nothing),
        "current_stream": lambda device=None: torch.cuda.current_stream(device), "set_stream": _nothing,
        "empty_cache": _nothing, "empty_host_cache": _nothing, "memory_allocated": _zero,
        "max_memory_allocated": _zero, "memory_reserved": _zero, "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _nothing, "reset_accumulated_memory_stats": _nothing,
        "memory_stats": properties.memory_stats, "get_memory_info": properties.mem_get_info,
        "get_device_capability": lambda device=None: {
            "supported_dtypes": {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                                 torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool}},
        **rng.accelerator_answers(),
    }
    if hasattr(accelerator, "device_index"):
        base = accelerator.device_index

        class device_index(base):  # noqa: N801 (torch's name)
            """``with torch.accelerator.device_index(n):`` on the simulated devices."""

            def __init__(self, device: Optional[int], /) -> None:
                self.idx = -1 if device is None else devices.index(device, "torch.accelerator.device_index")
                self.prev_idx = devices.current

            def __enter__(self) -> None:
                self.prev_idx = devices.current
                if self.idx >= 0:
                    devices.enter(self.idx)

            def __exit__(self, *exc: Any) -> None:
                devices.current = self.prev_idx

        answers["device_index"] = device_index
    return {("torch.accelerator." + name): value for name, value in answers.items()}


def _unsupported(ledger: Ledger) -> dict[str, Any]:
    """What has no CPU meaning, raising at first use what a CPU-only torch raises there, on either
    build. CUDA graphs, memory pools and external streams: classes whose construction raises
    RuntimeError (a CPU build's bases are dummies, or need a CUDA stream)."""
    names = ("torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.MemPool", "torch.cuda.ExternalStream",
             "torch.accelerator.Graph")
    classes = {name: _raising_class(_resolve(name), name, ledger.not_simulated) for name in names if _resolve(name)}
    note = ledger.not_simulated
    # Raw allocator and memory pool calls: a CPU-only torch fails in their first step (the current
    # device, an AssertionError), which the simulation answers, so they fail here the same way.
    functions = {name: raiser(name, note, kind=AssertionError, cause=NOT_COMPILED)
                 for name in ("torch.cuda.caching_allocator_alloc", "torch.cuda.caching_allocator_delete")}
    functions.update(_missing_bindings(note))

    @contextlib.contextmanager
    def use_mem_pool(pool: Any, device: Any = None) -> Iterator[None]:
        note("torch.cuda.use_mem_pool")
        raise not_simulated("torch.cuda.use_mem_pool", AssertionError, NOT_COMPILED)
        yield  # a context manager, as torch's: it fails on entry

    functions["torch.cuda.use_mem_pool"] = use_mem_pool
    # Jiterator kernels are made at import time by some libraries and fail when called, as they do
    # in a CPU-only torch (an AssertionError).
    for name in ("_create_jit_fn", "_create_multi_output_jit_fn"):
        functions[f"torch.cuda.jiterator.{name}"] = _jiterator_factory(f"torch.cuda.jiterator.{name}", note)
    return {**classes, **functions}


# What a CUDA build runs without a GPU but a CPU-only torch lacks (its torch._C has no such
# bindings): NCCL's own functions (its version, ids, communicators, collectives), TunableOp's flags
# and files, a CUDA graph pool's id. Left to torch, a script would get an answer on one build and an
# error on the other; it fails on both, as in a CPU-only torch. nccl.is_available answers on either
# (False: no simulated CUDA tensor is a CUDA tensor). ddpdoctor's own probes get torch's answer
# (the environment probe reports the NCCL a CUDA build ships).
_CPU_BUILD_LACKS = {
    "torch.cuda.nccl": (AttributeError, "module 'torch._C' has no NCCL bindings"),
    "torch.cuda.tunable": (AttributeError, "module 'torch._C' has no TunableOp bindings"),
}
_ANSWERED = frozenset({"torch.cuda.nccl.is_available"})


def _missing_bindings(note: Callable[[str], None]) -> dict[str, Any]:
    """Qualified name -> raiser, for every public function of the modules in ``_CPU_BUILD_LACKS``."""
    raisers: dict[str, Any] = {
        "torch.cuda.graph_pool_handle": raiser("torch.cuda.graph_pool_handle", note, kind=RuntimeError,
                                               cause="Tried to instantiate dummy base class _graph_pool_handle")}
    for module_name, (kind, cause) in _CPU_BUILD_LACKS.items():
        module = _resolve_module(module_name)
        for name in public_names(module) if module is not None else ():
            api = f"{module_name}.{name}"
            original = getattr(module, name, None)
            if api not in _ANSWERED and _guardable(original):
                raisers[api] = _for_the_script(raiser(api, note, kind=kind, cause=cause), original)
    return raisers


def _for_the_script(stand_in: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``stand_in`` for the script (torch and libraries included); ``original`` for ddpdoctor's own
    probes, which report the build as it is."""

    def call(*args: Any, **kwargs: Any) -> Any:
        chosen = original if _caller().startswith("ddpdoctor.") else stand_in
        return chosen(*args, **kwargs)

    return call


def _jiterator_factory(api: str, note: Callable[[str], None]) -> Callable[..., Any]:
    def create(code_string: str, *args: Any, **kwargs: Any) -> Callable[..., None]:
        return raiser(api, note, kind=AssertionError, cause="Jiterator is only supported on CUDA and ROCm GPUs")

    return create


def _raising_class(original: type, api: str, note: Callable[[str], None]) -> type:
    """A subclass of ``original`` whose construction records ``api`` and raises RuntimeError (the
    kind a CPU-only torch raises for these); isinstance, subclassing and annotations still work."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        note(api)
        raise not_simulated(api, RuntimeError)

    return type(original)(original.__name__, (original,), {
        "__new__": __new__, "__module__": original.__module__, "__qualname__": original.__qualname__,
        "__doc__": original.__doc__})


def _resolve(qualified: str) -> Any:
    module, _, name = qualified.rpartition(".")
    owner = _resolve_module(module)
    return None if owner is None else getattr(owner, name, None)


def _resolve_module(name: str) -> Optional[types.ModuleType]:
    try:
        return sys.modules.get(name) or importlib.import_module(name)
    except ImportError:
        return None


def _apply(rec: Recorder, ledger: Ledger, stand_ins: dict[str, Any]) -> None:
    """Replace every name of each stood-in object in ``OWNERS`` and guard the other public functions."""
    by_original: dict[int, Any] = {}
    for qualified, value in stand_ins.items():
        original = _resolve(qualified)
        if original is not None:
            value = by_original[id(original)] = _own(value)
            module, _, name = qualified.rpartition(".")
            _replace(rec, sys.modules[module], name, value)
    guards: dict[int, Any] = {}
    for owner_name in OWNERS:
        try:
            owner = importlib.import_module(owner_name)
        except ImportError:
            continue
        for name in public_names(owner):
            value = getattr(owner, name, None)
            if value is None:
                continue
            replacement = by_original.get(id(value))
            if replacement is not None:
                _replace(rec, owner, name, replacement)
            elif _guardable(value):
                guard = guards.get(id(value))
                if guard is None:
                    guard = guards[id(value)] = guarded(f"{owner_name}.{name}", value, ledger.not_simulated)
                _replace(rec, owner, name, guard)


def _own(value: Any) -> Any:
    """A function of its own for a callable stand-in: ``patch`` stamps it with torch's name and doc,
    which must not land on a shared function or a bound method. Classes and values stay as they are."""
    if isinstance(value, type) or not callable(value):
        return value

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return value(*args, **kwargs)

    return stand_in


def public_names(module: types.ModuleType) -> list[str]:
    """``__all__`` and the other public names the module defines (torch.cuda.nccl.version is not in
    its ``__all__``)."""
    own = {name for name, value in vars(module).items()
           if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__}
    return sorted(own | set(getattr(module, "__all__", None) or ()))


def _guardable(value: Any) -> bool:
    """A torch function (not a class, a module or a name imported from elsewhere)."""
    return (inspect.isfunction(value) or inspect.isbuiltin(value)) and \
        str(getattr(value, "__module__", "") or "").startswith("torch")


def guarded(api: str, fn: Callable[..., Any], note: Callable[[str], None]) -> Callable[..., Any]:
    """``fn`` as torch wrote it; a failure of the kinds a CPU-only torch raises for missing CUDA is
    recorded and re-raised as the same kind (:func:`cpu_build_kind`), naming ``api``."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotSimulatedError:
            raise
        except CPU_BUILD_ERRORS as exc:
            note(api)
            raise not_simulated(api, cpu_build_kind(exc), str(exc)) from exc

    return call


def cpu_build_kind(exc: BaseException) -> type[BaseException]:
    """The kind of ``exc`` as a CPU-only torch raises it: a CUDA build that found no GPU raises
    ``torch.AcceleratorError`` (a RuntimeError) from the CUDA runtime, which a CPU build never runs."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return RuntimeError
    return type(exc)


def _counter(ledger: Ledger) -> Any:
    """``counted(api, fn)``: ``fn``, counted as ``api`` when the script called it (not torch itself,
    e.g. the DataLoader asking for the current accelerator, nor another probe)."""

    def counted(api: str, fn: Any) -> Any:
        def simulated(*args: Any, **kwargs: Any) -> Any:
            if not _caller().startswith(("torch.", "ddpdoctor.")):
                ledger.count(api)
            with outside_torch_modes():  # torch's own code calls some of these at every forward
                return fn(*args, **kwargs)

        return simulated

    return counted


def _caller() -> str:
    """The module that called a stand-in, past the stand-in's own frames (its wrappers here)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", ""))


def _lazy_init_raiser(note: Any) -> Any:
    """torch.cuda's lazy CUDA initialization, reached by any torch.cuda API not simulated here: the
    CPU build's AssertionError, naming the API that needed it."""

    def _lazy_init() -> None:
        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "torch.cuda")
        api = f"{module}.{caller.f_code.co_name}"
        note(api)
        raise not_simulated(api, AssertionError, NOT_COMPILED)

    return _lazy_init


def _replace(rec: Recorder, owner: Any, name: str, value: Any) -> None:
    """Patch ``owner.name`` with ``value`` where this torch version has the attribute, keeping its
    kind: a class by a class, a function by a function, any other value by one of its type."""
    original = getattr(owner, name, None)
    if original is None or original is value:
        return
    if isinstance(original, type):
        assert isinstance(value, type), f"{name}: a class must stay a class"
    elif callable(original):
        assert callable(value) and not isinstance(value, type), f"{name}: a function must stay a function"
    else:
        assert type(value) is type(original), f"{name}: a {type(original).__name__} must stay one"
    patch(rec, "device", owner, name, lambda _original: value)


__all__ = ["SimulatedDevices", "install", "local_device_count", "is_cuda", "public_names", "OWNERS"]
