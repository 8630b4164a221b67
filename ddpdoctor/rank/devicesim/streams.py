"""``torch.cuda.Stream`` and ``torch.cuda.Event`` on the CPU.

CPU work is already ordered, so a stream's methods do nothing and an event stamps the CPU clock.
Both are subclasses of torch's own classes, torch.cuda's and (as CUDA streams are on GPUs) the
device-generic ``torch.Stream`` / ``torch.Event``, so ``isinstance(s, torch.cuda.Stream)`` (either
name, ``torch.cuda.streams.Stream`` included), subclassing, annotations such as ``Stream | None``
and ``tensor.record_stream(s)`` work as with CUDA.

torch's constructors never run, on either build (:func:`bare_instance`): a CPU build's torch.cuda
bases are dummies that refuse to instantiate, a CUDA build's (``_CudaStreamBase``) asks the CUDA
driver for the current device, and Python refuses ``object.__new__`` for a subclass of a C type
with a constructor of its own (torch.Stream, torch.Event). Every attribute a script reads
(``device``, ``device_index``, ``stream_id``, ``cuda_stream``...) is the stand-in's own, so both
builds answer alike and the C fields of torch's bases stay unread.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Optional, TypeVar

import torch
import torch.cuda.streams as cuda_streams

from ddpdoctor.rank.torch_modes import outside_torch_modes

T = TypeVar("T")

CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, as torch.cuda.Stream.device_type answers

# PyType_GenericAlloc, the allocator of every heap type (what object.__new__ calls), through the
# Python C API with the GIL held. It zero-fills the instance, C fields included.
_generic_alloc = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.c_ssize_t)(
    ("PyType_GenericAlloc", ctypes.pythonapi))


def bare_instance(cls: type[T]) -> T:
    """An instance of ``cls`` allocated without any ``__new__`` of its bases: what ``object.__new__``
    does, minus its refusal of a class whose C base has a constructor of its own. The C fields of such
    a base are zero (a CUDA build's stream: ids 0; its event: not created, so nothing to destroy)."""
    return _generic_alloc(cls, 0)


def stream_classes(devices: Any, *, bases: Optional[tuple[type, type]] = None) -> tuple[type, type]:
    """(Stream, Event) for the simulated ``devices`` (``.current``, ``.index(device, api)``), subclasses
    of ``bases`` (torch.cuda's Stream and Event; a test passes stand-ins for another build's)."""
    stream_base, event_base = bases or (cuda_streams.Stream, cuda_streams.Event)
    event = _event_class(_generic(event_base, getattr(torch, "Event", None)), devices)
    return _stream_class(_generic(stream_base, getattr(torch, "Stream", None)), event, devices), event


def _generic(base: type, generic: Optional[type]) -> tuple[type, ...]:
    """``base``, and torch's device-generic class (torch.Stream, torch.Event) where ``base`` is not
    one (a CPU build's dummies): a CUDA stream is a torch.Stream on either build, the only kind
    ``Tensor.record_stream`` accepts."""
    return (base,) if generic is None or issubclass(base, generic) else (base, generic)


def _stream_class(bases: tuple[type, ...], event_class: type, devices: Any) -> type:
    class Stream(*bases):  # type: ignore[misc]
        """A simulated CUDA stream: a no-op on the CPU, on the current simulated device."""

        def __new__(cls, device: Any = None, priority: int = 0, **_kwargs: Any) -> "Stream":
            return bare_instance(cls)

        def __init__(self, device: Any = None, priority: int = 0, **_kwargs: Any) -> None:
            index = devices.current if device is None or device == -1 else devices.index(device, "torch.cuda.Stream")
            with outside_torch_modes():  # DDP's forward asks for the current stream: no mode sees it
                self._device = torch.device("cuda", index)
            self._priority = priority

        @property
        def device(self) -> torch.device:
            return self._device

        @property
        def device_index(self) -> int:
            return self._device.index

        @property
        def device_type(self) -> int:
            return CUDA_DEVICE_TYPE

        @property
        def priority(self) -> int:
            return self._priority

        @property
        def stream_id(self) -> int:
            return 0

        @property
        def cuda_stream(self) -> int:
            return 0

        @property
        def native_handle(self) -> int:
            return 0

        def wait_event(self, event: Any) -> None:
            pass

        def wait_stream(self, stream: Any) -> None:
            pass

        def record_event(self, event: Optional[Any] = None) -> Any:
            event = event_class() if event is None else event
            event.record(self)
            return event

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def is_capturing(self) -> bool:  # torch.Stream's; optimizers ask it before every step
            return False

        def __enter__(self) -> "Stream":
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

        def __eq__(self, other: object) -> bool:
            return self is other or (isinstance(other, Stream) and other.device == self.device)

        def __ne__(self, other: object) -> bool:  # not torch.Stream's, which compares its C fields
            return not self == other

        def __hash__(self) -> int:
            return hash(self._device)

        def __repr__(self) -> str:
            return f"<torch.cuda.Stream device={self._device} cuda_stream=0x0 (ddpdoctor simulated, CPU)>"

    return Stream


def _event_class(bases: tuple[type, ...], devices: Any) -> type:
    class Event(*bases):  # type: ignore[misc]
        """A simulated CUDA event: ``record()`` stamps the CPU clock; ``elapsed_time()`` is in ms."""

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                    **_kwargs: Any) -> "Event":
            return bare_instance(cls)

        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                     **_kwargs: Any) -> None:
            self.enable_timing = enable_timing
            self._t: Optional[float] = None
            self._device: Optional[torch.device] = None

        @property
        def device(self) -> Optional[torch.device]:
            """Where the event was recorded (None before, as a CUDA event not yet created)."""
            return self._device

        @property
        def cuda_event(self) -> int:
            return 0

        @property
        def event_id(self) -> int:
            return 0

        def record(self, stream: Any = None) -> None:
            self._device = torch.device("cuda", devices.current) if stream is None else getattr(stream, "device", None)
            self._t = time.perf_counter()

        def wait(self, stream: Any = None) -> None:
            pass

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end_event: "Event") -> float:
            if self._t is None or getattr(end_event, "_t", None) is None:
                raise RuntimeError("elapsed_time: both events must be recorded first")
            return (end_event._t - self._t) * 1000.0

        def __repr__(self) -> str:
            state = "recorded" if self._t is not None else "uninitialized"
            return f"<torch.cuda.Event {state} (ddpdoctor simulated, CPU)>"

    return Event

