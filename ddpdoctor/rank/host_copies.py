"""Device values that reach the host one step later, so that the host never waits for the device.

A sampled step's fingerprints and loss counts are small tensors computed on the step's own device.
Reading them at once (``.tolist()``) makes the host wait for the whole step to finish on a GPU, and
then the GPU waits for the host to launch the next step's kernels: the host cannot run ahead, and
every sampled step pays its Python time on top of the device's (1.18x on an H100 GPT with every
step sampled, BENCHMARKS.md). Here, a CUDA tensor's values are copied without blocking into pinned
host memory, behind a CUDA event, and the consumer (``then``) runs once the event has completed:
at a later optimizer step (:meth:`HostCopies.poll`), or when the rank ends, fails or is asked for
a hang's dump (:meth:`HostCopies.flush`).

Consumers run in the order they were queued, whatever their device: a value resolved at once
while earlier ones still wait is queued behind them, so events keep their order in the evidence.
CPU tensors are never deferred (a CPU op has finished when it returns); neither is a tensor on
another device type, on several devices, or in a CUDA graph capture.

At most :data:`MAX_BEHIND` entries wait: a host that runs further ahead waits for the oldest, which
bounds the pinned memory and how late evidence can be. A flush never waits on a device without a
limit (a device stuck in a hung collective must not hang the rank's teardown): what has not
completed by then is handed over as None, and the consumer writes what it has without it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Optional, Sequence

if TYPE_CHECKING:  # the recorder exists before torch is imported (rank/probes/__init__.py pauses the GC for that)
    import torch

Consumer = Callable[[Optional[list[list]]], None]  # host values per tensor, None when they never came

MAX_BEHIND = 8  # entries waiting at most before the host waits for the oldest (two per fingerprinted step)
FLUSH_WAIT_S = 5.0  # how long a flush waits for the device, at most


class _Entry:
    __slots__ = ("copies", "event", "then")

    def __init__(self, copies: list["torch.Tensor"], event: Optional[object], then: Consumer) -> None:
        self.copies = copies  # host tensors (pinned when copied from a GPU)
        self.event = event  # a torch.cuda.Event; None: the copies are complete already
        self.then = then

    def ready(self) -> Optional[bool]:
        """Whether the copies have arrived; None when they never will (the device failed: a CUDA
        error is sticky, and every later query raises it again)."""
        try:
            return self.event is None or bool(self.event.query())  # type: ignore[attr-defined]
        except Exception:
            return None

    def values(self, arrived: Optional[bool]) -> Optional[list[list]]:
        return [c.tolist() for c in self.copies] if arrived else None

    def wait(self) -> bool:
        try:
            self.event.synchronize()  # type: ignore[union-attr]
            return True
        except Exception:
            return False


class HostCopies:
    """The queue of device values on their way to the host, drained in order."""

    def __init__(self, *, on_error: Callable[[BaseException], None], defer_cpu: bool = False) -> None:
        self._queue: deque[_Entry] = deque()
        self._lock = threading.RLock()  # the watchdog's dump flushes from its own thread
        self._on_error = on_error  # a consumer's failure is reported, never raised into the script
        self._defer_cpu = defer_cpu  # tests: exercise the deferred path with CPU tensors

    def __len__(self) -> int:
        return len(self._queue)

    def later(self, tensors: Sequence["torch.Tensor"], then: Consumer) -> None:
        """Call ``then`` with each tensor's values as a host list, once they are on the host: now
        when nothing is waiting and nothing needs to, else at a later :meth:`poll` or
        :meth:`flush`, after the entries queued before it."""
        device = _deferrable_device(tensors)
        with self._lock:
            if device is None and not self._queue and not self._defer_cpu:
                self._run(then, [t.tolist() for t in tensors])
                return
            if device is None:
                self._queue.append(_Entry([t.to("cpu") for t in tensors], None, then))
            else:
                import torch

                copies = [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned memory
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                self._queue.append(_Entry(copies, event, then))

    def poll(self) -> None:
        """Run the consumers whose values have arrived, oldest first; wait for the oldest while more
        than :data:`MAX_BEHIND` are queued."""
        with self._lock:
            while self._queue:
                entry = self._queue[0]
                arrived = entry.ready()
                if arrived is False:
                    if len(self._queue) <= MAX_BEHIND:
                        return
                    arrived = entry.wait()
                self._queue.popleft()
                self._run(entry.then, entry.values(arrived))

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Run every queued consumer now: with its values where the device delivers them within
        ``wait_s``, with None where it does not (a device stuck in a collective)."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while self._queue:
                entry = self._queue.popleft()
                arrived = entry.ready()
                while arrived is False and time.monotonic() < deadline:
                    time.sleep(0.001)
                    arrived = entry.ready()
                self._run(entry.then, entry.values(arrived))

    def _run(self, then: Consumer, values: Optional[list[list]]) -> None:
        try:
            then(values)
        except Exception as exc:
            self._on_error(exc)


def _deferrable_device(tensors: Sequence["torch.Tensor"]) -> Optional["torch.device"]:
    """The one CUDA device all ``tensors`` are on, when their copy can wait behind an event."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    device = next(iter(devices))
    if device.type != "cuda":
        return None
    import torch

    try:
        if torch.cuda.is_current_stream_capturing():
            return None
    except Exception:
        return None
    return device
