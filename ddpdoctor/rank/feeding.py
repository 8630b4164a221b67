"""Which loader passes fed training: DDP training forwards and optimizer steps attributed to the
passes whose batches they consumed.

A pass is a training pass because its batches are trained on, not because optimizer steps happen
while it is open: an evaluation loop nested in the training loop (a few batches of the validation
loader every N steps, an iterator kept open across steps, a second iterator over the training
loader itself) overlaps training in time but feeds none of it. Forwards are counted between yields:
the passes that yielded since the last training forward fed it (two loaders zipped both do), except
a pass whose iterator is gone, or that yielded several batches with no training forward in between
(its batches went to evaluation) once another pass yields.
"""

from __future__ import annotations

from typing import Callable


class Fed:
    """What one pass fed: DDP training forwards and optimizer steps."""

    __slots__ = ("forwards", "steps", "unfed_yields")

    def __init__(self) -> None:
        self.forwards = 0
        self.steps = 0
        self.unfed_yields = 0  # batches yielded since this pass last fed a forward or a step


class FeedTracker:
    """Attributes training to passes (one tracker per probe; passes register their :class:`Fed`)."""

    def __init__(self, forwards: Callable[[], int], steps: Callable[[], int]) -> None:
        self._forwards = forwards
        self._steps = steps
        self._fresh: dict[int, Fed] = {}  # passes whose latest batches no forward has consumed yet
        self._last = (forwards(), steps())

    def flush(self) -> None:
        """Attribute the forwards and steps since the last call to the passes that fed them."""
        now = (self._forwards(), self._steps())
        forwards, steps = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        if not (forwards or steps):
            return
        for fed in self._fresh.values():
            fed.forwards += forwards
            fed.steps += steps
            fed.unfed_yields = 0
        if forwards:
            self._fresh = {}

    def yielded(self, fed: Fed) -> None:
        self.flush()
        for key, other in list(self._fresh.items()):
            if other is not fed and other.unfed_yields >= 2:
                del self._fresh[key]  # several batches and no training between them: evaluation
        fed.unfed_yields += 1
        self._fresh[id(fed)] = fed

    def finished(self, fed: Fed) -> None:
        """The pass ended (exhausted, or its iterator is gone): what it fed so far is final."""
        self.flush()
        self._fresh.pop(id(fed), None)
