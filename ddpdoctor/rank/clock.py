"""The rank's collective clock: how many world-group collectives it has taken part in, DDP's own
included, and which of them no traced call made.

DDP's constructor, its forward (buffer broadcast, the first-iteration bucket rebuild) and its
backward (gradient bucket all-reduces, the find_unused_parameters bitmap) issue collectives from C++,
where no Python patch sees them. gloo and NCCL number every collective of a process group (the
flight recorder's ``collective_seq_id``; ``ProcessGroup._get_sequence_number_for_group``), so the
clock reads that number at each observation point (a traced call, a DDP forward, an event written)
and books the gap since the last one as :class:`InternalCollectives`, attributed to what the rank was
doing: a DDP forward, a backward, the constructor. One C++ getter per observation, no collective.

The numbering (``units``) counts collectives, not point-to-point operations: gloo numbers sends and
receives in the same sequence, NCCL does not, so each traced call's own span is measured and its
point-to-point part taken out. Every rank then numbers the same collective the same way.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ddpdoctor.schema.events import InternalCollectives, InternalPhase

# Traced calls that issue no collective on the group's numbering (their traffic is point-to-point).
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# Calls made of point-to-point traffic that still count as one collective (every rank calls them).
P2P_COLLECTIVES = frozenset({"monitored_barrier"})
# Calls that issue no collective at all (new_group synchronizes through the store).
STORE_ONLY = frozenset({"new_group"})


def units_of(op: str, span: int) -> int:
    """Collectives a traced call counts for, given how far it moved the backend's sequence number."""
    if op in POINT_TO_POINT or op in STORE_ONLY:
        return 0
    if op in P2P_COLLECTIVES:
        return 1
    return max(span, 1)


class Phase:
    """What the rank is doing, for attributing the collectives the backend issued meanwhile."""

    __slots__ = ("name", "ddp", "grad", "training", "site", "site_fn")

    def __init__(self, name: str = InternalPhase.OTHER, *, ddp: Optional[int] = None, grad: Optional[bool] = None,
                 training: Optional[bool] = None, site: Optional[list] = None,
                 site_fn: Optional[Callable[[], list]] = None) -> None:
        self.name = name
        self.ddp = ddp
        self.grad = grad
        self.training = training
        self.site = site
        self.site_fn = site_fn  # computes the site only if collectives are booked to this phase

    def resolved_site(self) -> list:
        if self.site is None:
            self.site = self.site_fn() if self.site_fn is not None else []
        return self.site


class CollectiveClock:
    """World-group collective numbering of one rank process (see the module docstring)."""

    def __init__(self, write: Callable[[InternalCollectives], None]) -> None:
        self._write = write  # the recorder's raw writer (no clock sync: no recursion)
        self._group: Any = None
        self.numbering = "calls"  # "pg" once the backend's sequence numbers are readable
        self.units = 0  # collectives numbered so far
        self._accounted = 0  # the backend's sequence number up to which collectives are booked
        self.phase = Phase()
        self._group_calls: dict[tuple, int] = {}  # subgroup ranks -> its traced calls so far
        self._in_call = False  # a traced call is running: its collectives are its own, not a gap
        self._lock = threading.RLock()  # the watchdog books what a hung rank issued, from its thread

    # -- set-up ---------------------------------------------------------------------------------
    def attach(self, group: Any) -> None:
        """Start numbering on ``group`` (the world group, after init_process_group)."""
        self._group = group
        seq = self._read()
        self.numbering = "pg" if seq is not None else "calls"
        self._accounted = seq or 0

    def detach(self) -> None:
        """The process group is being destroyed: book what is left, then stop reading it."""
        with self._lock:
            self._sync()
            self._group = None

    def _read(self) -> Optional[int]:
        if self._group is None:
            return None
        try:
            return int(self._group._get_sequence_number_for_group())
        except Exception:  # a backend without numbering, or a group already destroyed
            return None

    # -- observation ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Book the collectives issued since the last observation to the current phase."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        if self.numbering != "pg" or self._in_call:
            return
        seq = self._read()
        if seq is None or seq <= self._accounted:
            return
        count = seq - self._accounted
        self._accounted = seq
        phase = self.phase
        first = self.units + 1
        self.units += count
        self._write(InternalCollectives(t=time.time(), first=first, count=count, phase=phase.name, ddp=phase.ddp,
                                        grad=phase.grad, training=phase.training, site=phase.resolved_site()))

    def enter(self, phase: Phase) -> None:
        """Book what the previous phase issued, then attribute new collectives to ``phase``."""
        with self._lock:
            self._sync()
            self.phase = phase

    # -- traced calls ---------------------------------------------------------------------------
    def before_call(self, op: str, units: int, *, group: Optional[tuple] = None) -> tuple[int, Optional[int]]:
        """Called just before a traced call, which is recorded before it runs (a call that hangs
        must be in the trace): books earlier collectives and counts the call's ``units`` at once, so
        what the rank writes from now on is ordered after it. Returns (the call's number ``n``, the
        world group's sequence number now; None for a subgroup or a backend that does not number)."""
        with self._lock:
            if group is not None:
                return self._group_calls.get(group, 0) + 1, None
            before = None
            if self.numbering == "pg":
                self._sync()
                before = self._accounted
                self._in_call = True
            n = self.units + 1
            self.units += units
            return n, before

    def after_call(self, op: str, n: int, units: int, before: Optional[int], *, group: Optional[tuple] = None) -> None:
        """Called once a traced call returned (or was enqueued): numbers what it really issued."""
        with self._lock:
            if group is not None:
                self._group_calls[group] = max(self._group_calls.get(group, 0), n)
                return
            if before is None:  # a backend without numbering: one number per call, as predicted
                return
            self._in_call = False
            seq = self._read()
            span = max(0, (seq if seq is not None else before) - before)
            self._accounted = before + span
            self.units = n - 1 + units_of(op, span)

    def peek(self) -> int:
        """The numbering including collectives not booked yet (for heartbeats: no event written)."""
        if self.numbering != "pg" or self._in_call:
            return self.units
        seq = self._read()
        return self.units + max(0, (seq or 0) - self._accounted)
