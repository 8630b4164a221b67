"""The stop-signal policy: what ddpdoctor does when it is asked to stop, whoever asks.

A terminal's Ctrl-C (SIGINT to the whole foreground process group), a closed terminal (SIGHUP),
``kill`` or a container runtime (SIGTERM), and a cluster scheduler (Slurm's ``scancel``, time limit
and preemption send SIGTERM, ``--signal`` may send SIGUSR1/SIGUSR2 earlier) all end the same way:
the monitor stops every rank, the report is written with outcome ``interrupted`` naming the
signal, findings drawn from the counts the stop cut off are left out (analysis/interruption.py),
and ddpdoctor exits with 128 + the signal's number, as a shell does for a process a signal ended.

One :class:`StopSignals` is installed for the whole of ``run()``, start-up included, and restored
afterwards. The same signal often arrives more than once (the terminal and a launcher that
forwards it, srun and slurmstepd): only the first counts, the others are ignored, so a stop is
never turned into a crash halfway through writing the report.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Optional

__all__ = ["STOP_SIGNALS", "StopSignals", "exit_code_for", "signal_name"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                                           signal.SIGUSR2)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_number(name: str) -> Optional[int]:
    try:
        return int(signal.Signals[name])
    except KeyError:
        return None


def exit_code_for(signum: int) -> int:
    """What a shell reports for a process ended by ``signum`` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class StopSignals:
    """Records the first stop signal while installed; the monitor polls :attr:`received`.

    Installed only on the main thread (Python allows handlers nowhere else): from another thread,
    the caller owns the signals and this records nothing.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: Optional[int] = None
        self.received_at: float = 0.0  # wall time (time.time()): the ranks' events are ordered against it
        self.repeats = 0
        self._previous: dict[int, object] = {}

    @property
    def name(self) -> Optional[str]:
        return signal_name(self.received) if self.received is not None else None

    def install(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def __enter__(self) -> "StopSignals":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def record(self, signum: int, at: Optional[float] = None) -> None:
        """Count ``signum`` as received (the handler's work; also how a peer's signal is adopted)."""
        if self.received is None:
            self.received = int(signum)
            self.received_at = time.time() if at is None else at
        else:
            self.repeats += 1

    def _on_signal(self, signum: int, frame: object) -> None:
        self.record(signum)
