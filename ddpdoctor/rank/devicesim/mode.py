"""CUDA tensors and modules become CPU ones: a TorchFunctionMode that rewrites device arguments.

A mode (not patches on every factory function) because torch routes factory functions
(``torch.zeros(..., device=0)``), Tensor methods (``.to``, ``.cuda``) and ``Module.to``'s argument
parser (``torch._C._nn._parse_to``) through ``__torch_function__`` modes. The fast path, taken by
every other torch call in the script, is one dict lookup and one truth test. Modes are per thread:
the DataLoader's pin-memory thread is covered by the ``pin_memory`` patch below instead.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode, _pop_mode_temporarily

from ddpdoctor.rank.devicesim.errors import invalid_ordinal, negative_index
from ddpdoctor.rank.devicesim.ledger import MAP_LOCATION, MODULES, PIN_MEMORY, TENSORS, Ledger

CPU = torch.device("cpu")


def is_cuda(device: Any) -> bool:
    """Whether a device argument names a CUDA device (an int is an accelerator ordinal in torch)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool)


def checked_index(device: Any, count: int) -> int | None:
    """The CUDA index a device argument names (None: the current device), raising what torch raises
    for one it refuses: "Device index must not be negative" (its argument parser, on any machine),
    "Invalid device string" (``"cuda:-1"``), or "invalid device ordinal" past the ``count`` GPUs of
    this node (as a GPU machine does when the tensor is placed)."""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise negative_index()
        index: int | None = device
    else:
        index = torch.device(device).index if isinstance(device, str) else device.index
    if index is not None and index >= count:
        raise invalid_ordinal()
    return index


class CpuDeviceMode(TorchFunctionMode):
    """Rewrites CUDA device arguments to the CPU; everything else passes through untouched. A device
    index that torch would refuse (negative, or past the ``device_count`` simulated GPUs) raises
    torch's own error instead, so a script that asks for device -1 fails here as it would on GPUs."""

    def __init__(self, ledger: Ledger, device_count: Callable[[], int] = lambda: 1 << 30) -> None:
        super().__init__()
        self.ledger = ledger
        self.device_count = device_count
        self.special: dict[Any, Callable[..., Any]] = {
            torch.Tensor.to: self._to, torch._C._nn._parse_to: self._to, torch.Tensor.cuda: self._cuda,
            torch.Tensor.pin_memory: self._pin_memory, torch.Tensor.is_pinned: self._is_pinned,
            torch.Tensor.record_stream: self._record_stream, torch.Tensor.type: self._type,
        }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = self.special.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        if kwargs:
            device = kwargs.get("device")
            if device is not None and is_cuda(device):
                self._note(TENSORS, device)
                kwargs = {**kwargs, "device": CPU}
            return func(*args, **kwargs)
        return func(*args)

    def _note(self, what: str, device: Any) -> None:
        """Count a simulated placement on ``device`` (None: the current device), after checking it
        as torch would."""
        index = None if device is None else checked_index(device, self.device_count())
        self.ledger.count(what)
        if index is not None:
            self.ledger.device(index)

    def _to(self, func, args, kwargs):
        """``Tensor.to`` and ``Module.to``'s parser: the device is positional or ``device=``."""
        what = MODULES if func is torch._C._nn._parse_to else TENSORS
        if any(is_cuda(a) for a in args):
            for a in args:
                if is_cuda(a):
                    self._note(what, a)
            args = tuple(CPU if is_cuda(a) else a for a in args)
        device = kwargs.get("device")
        if device is not None and is_cuda(device):
            self._note(what, device)
            kwargs = {**kwargs, "device": CPU}
        return func(*args, **kwargs)

    def _cuda(self, func, args, kwargs):
        """``tensor.cuda(...)`` (also what ``Module.cuda`` calls): the tensor, on the CPU already."""
        self._note(TENSORS, kwargs.get("device", args[1] if len(args) > 1 else None))
        memory_format = kwargs.get("memory_format")
        tensor = args[0]
        return tensor.contiguous(memory_format=memory_format) if memory_format is not None else tensor

    def _type(self, func, args, kwargs):
        """``tensor.type("torch.cuda.FloatTensor")``: the CPU type of that name (the class form,
        ``torch.cuda.FloatTensor``, is the CPU class already: see cuda_api)."""
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            self._note(TENSORS, "cuda")
            dtype = "torch." + dtype[len("torch.cuda."):]
            if "dtype" in kwargs:
                kwargs = {**kwargs, "dtype": dtype}
            else:
                args = (args[0], dtype, *args[2:])
        return func(*args, **kwargs)

    def _pin_memory(self, func, args, kwargs):
        self.ledger.count(PIN_MEMORY)
        return args[0]

    def _is_pinned(self, func, args, kwargs):
        return False

    def _record_stream(self, func, args, kwargs):
        return None


def cpu_map_location(map_location: Any) -> Any:
    """torch.load's ``map_location`` under simulation: every form (None, a string, a device, a dict,
    a callable) only says where storages go, and under simulation that is always the CPU; a
    callable's ``storage.cuda(rank)`` has no CPU meaning, so it is not called."""
    return "cpu"


def wrap_load(ledger: Ledger) -> Callable[[Any], Any]:
    def wrap(original):
        def load(f, *args, **kwargs):
            asked = args[0] if args else kwargs.get("map_location")
            if args:  # load(f, map_location, pickle_module, ...)
                args = (cpu_map_location(asked), *args[1:])
            else:
                kwargs["map_location"] = cpu_map_location(asked)
            if not (asked == "cpu" or asked == CPU):
                ledger.count(MAP_LOCATION)
            return original(f, *args, **kwargs)

        return load

    return wrap


def wrap_pin_memory(ledger: Ledger) -> Callable[[Any], Any]:
    """DataLoader(pin_memory=True) pins each batch, from its own thread where no mode is active."""

    def wrap(_original):
        def pin_memory(data, device=None):
            ledger.count(PIN_MEMORY)
            return data

        return pin_memory

    return wrap


def _on_top(mode: TorchFunctionMode) -> bool:
    """Whether ``mode`` is the innermost torch function mode of this thread (no mode of the script's
    was pushed after it)."""
    depth = torch._C._len_torch_function_stack()
    return depth > 0 and torch._C._get_function_stack_at(depth - 1) is mode


def wrap_profile_hook_step(cpu_mode: CpuDeviceMode) -> Callable[[Any], Any]:
    """``Optimizer.profile_hook_step``, which wraps each optimizer class's ``step`` at its first
    instance: torch.optim's own step bodies run with the simulation's mode popped.

    A built-in optimizer's step places nothing by device name (its state goes where each parameter
    is), yet AdamW's step makes about 20 torch calls per parameter, each paying the mode's dispatch
    (0.7 µs against 0.04; issue #34). Only the body is outside the mode: the step hooks (the script's
    included) run inside it as before. The mode stays for a step given arguments (a closure runs the
    script's forward and backward, as LBFGS's does), for a class of the script's own or another
    library's, even one that keeps a built-in step (what it overrides may place tensors on "cuda"),
    for ZeroRedundancyOptimizer (in torch.distributed.optim), under torch.compile, and when a mode
    of the script's is innermost."""

    def wrap(original):
        def profile_hook_step(func):
            return original(_step_outside(func, cpu_mode))

        return profile_hook_step

    return wrap


def wrap_zero_grad(cpu_mode: CpuDeviceMode) -> Callable[[Any], Any]:
    """``Optimizer.zero_grad``: run with the simulation's mode popped for torch.optim's own classes.
    It reads and sets each parameter's ``.grad`` (two calls through the mode per parameter, every
    step: 300 for a 149-tensor GPT) and places nothing; a class of the script's own, which may
    override what it calls, keeps the mode."""

    def wrap(original):
        def zero_grad(self, *args, **kwargs):
            if not _builtin(type(self)):
                return original(self, *args, **kwargs)
            return _run_outside(cpu_mode, original, self, *args, **kwargs)

        return zero_grad

    return wrap


def wrap_map_fetch(cpu_mode: CpuDeviceMode) -> Callable[[Any], Any]:
    """``_MapDatasetFetcher.fetch`` (a batch of a map-style dataset, in the loop's process or a
    worker): run with the simulation's mode popped for torch's own ``TensorDataset`` collated by
    ``default_collate``. Its ``__getitem__`` indexes each of its tensors once per sample (128 calls
    through the mode for a batch of 64 pairs) and neither it nor the collation places anything by
    device name; any other dataset or collate function runs inside the mode, as the script wrote it."""
    from torch.utils.data import TensorDataset
    from torch.utils.data._utils.collate import default_collate, default_convert

    def wrap(original):
        def fetch(self, possibly_batched_index):
            if type(self.dataset) is not TensorDataset or self.collate_fn not in (default_collate, default_convert):
                return original(self, possibly_batched_index)
            return _run_outside(cpu_mode, original, self, possibly_batched_index)

        return fetch

    return wrap


def _builtin(owner: Any) -> bool:
    """Whether a function or class is torch.optim's own (not a subclass or an override of the script's)."""
    return str(getattr(owner, "__module__", "")).startswith("torch.optim.")


def _run_outside(cpu_mode: CpuDeviceMode, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` with the simulation's mode popped, where it is the innermost mode
    and torch.compile is not tracing (else inside it, as the script runs it)."""
    if torch.compiler.is_compiling() or not _on_top(cpu_mode):
        return func(*args, **kwargs)
    with _pop_mode_temporarily():
        return func(*args, **kwargs)


def _step_outside(func: Callable[..., Any], cpu_mode: CpuDeviceMode) -> Callable[..., Any]:
    """``func`` (a class's step), run outside the mode when it and the stepped optimizer's class are
    torch.optim's own: a subclass of the script's that keeps AdamW's step may override what it calls."""
    if not _builtin(func):
        return func

    @functools.wraps(func)
    def step(*args, **kwargs):
        if len(args) != 1 or kwargs or not _builtin(type(args[0])):
            return func(*args, **kwargs)
        return _run_outside(cpu_mode, func, *args)

    return step
