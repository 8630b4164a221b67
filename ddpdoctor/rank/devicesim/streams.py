"""``torch.cuda.Stream`` and ``torch.cuda.Event`` on the CPU.

CPU work is already ordered, so a stream's methods do nothing and an event stamps the CPU clock.
Both are subclasses of torch's own classes, so ``isinstance(s, torch.cuda.Stream)`` (either name,
``torch.cuda.streams.Stream`` included), subclassing and annotations such as ``Stream | None`` work
as with CUDA. torch's constructors are skipped: in a CPU build their bases refuse to instantiate.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.cuda.streams as cuda_streams


def stream_classes(devices: Any) -> tuple[type, type]:
    """(Stream, Event) for the simulated ``devices`` (``.current``, ``.index(device, api)``)."""

    class Stream(cuda_streams.Stream):
        """A simulated CUDA stream: a no-op on the CPU, on the current simulated device."""

        def __new__(cls, device: Any = None, priority: int = 0, **_kwargs: Any) -> "Stream":
            return object.__new__(cls)

        def __init__(self, device: Any = None, priority: int = 0, **_kwargs: Any) -> None:
            index = devices.current if device is None or device == -1 else devices.index(device, "torch.cuda.Stream")
            self.device_index = index
            self.device_type = 1  # c10::DeviceType::CUDA, as torch.cuda.Stream answers
            self.device = torch.device("cuda", index)
            self.priority = priority
            self.stream_id = 0
            self.cuda_stream = 0

        def wait_event(self, event: Any) -> None:
            pass

        def wait_stream(self, stream: Any) -> None:
            pass

        def record_event(self, event: Optional["Event"] = None) -> "Event":
            event = Event() if event is None else event
            event.record(self)
            return event

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def is_capturing(self) -> bool:  # torch.Stream's; optimizers ask it before every step
            return False

        @property
        def native_handle(self) -> int:
            return 0

        def __enter__(self) -> "Stream":
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

        def __eq__(self, other: object) -> bool:
            return self is other or (isinstance(other, Stream) and other.device == self.device)

        def __hash__(self) -> int:
            return hash(self.device)

        def __repr__(self) -> str:
            return f"<torch.cuda.Stream device={self.device} cuda_stream=0x0 (ddpdoctor simulated, CPU)>"

    class Event(cuda_streams.Event):
        """A simulated CUDA event: ``record()`` stamps the CPU clock; ``elapsed_time()`` is in ms."""

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                    **_kwargs: Any) -> "Event":
            return object.__new__(cls)

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

        def elapsed_time(self, end_event: "Event") -> float:
            if self._t is None or getattr(end_event, "_t", None) is None:
                raise RuntimeError("elapsed_time: both events must be recorded first")
            return (end_event._t - self._t) * 1000.0

        def __repr__(self) -> str:
            return f"<torch.cuda.Event {'recorded' if self._t is not None else 'uninitialized'} (ddpdoctor simulated, CPU)>"

    return Stream, Event
