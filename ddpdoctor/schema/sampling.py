"""Which optimizer steps (and training forwards) get fingerprinted.

Every rank must fingerprint the same steps, so the schedule is a pure function of the step
number. Divergence persists once it happens (replicas never re-converge by themselves), so a
sparse schedule still catches it, only later. The automatic schedule fingerprints every step while
structural bugs show (the first 10: a missing all-reduce, an unsynchronized init or a rank-dependent
setting shows at step 1), then every 20th up to step 200, then every 50th: the probes' cost
amortizes to a few percent of training even for large models and short jobs. A fingerprinted step
reads every gradient and parameter once and takes the checks' other samples (about 10% of a CPU
step). A bug that first shows after step 10 is reported at most 19 steps later, at the next multiple
of 20 (issue #34: every 10th step, nine more fingerprinted steps in 200, cost 0.5-0.7% of that job's
mean step to report such a bug ten steps sooner).

A fingerprinted step also takes the evidence that explains what its fingerprints find, and the
global-batch check's: DDP's all-reduce snapshot (whether gradients already differed as the
all-reduce left them, or were changed after it) and the loss window (each rank's loss weights and
local-gradient samples). Those stay on the automatic schedule's pace when ``--fingerprint-every``
asks for more fingerprints (:func:`explains`): what a denser schedule buys is the exact step a
divergence starts, and its cost is the one read of gradients and parameters per step; the cause
of a divergence and a loss's weighting are structural, the same at the next explained step (issue
#34: on the every-step run of the 200-step job, they were 1.6 ms of a fingerprinted step's 11).
"""

from __future__ import annotations

AUTO = 0
DENSE_STEPS = 10  # the automatic schedule fingerprints steps 1..DENSE_STEPS, every one,
SPARSE_EVERY = 20  # then every SPARSE_EVERY-th step up to SPARSE_UNTIL,
SPARSE_UNTIL = 200
LATE_EVERY = 50  # then every LATE_EVERY-th


def should_fingerprint(n: int, every: int = AUTO) -> bool:
    """Whether the ``n``-th (1-based) step is fingerprinted under ``--fingerprint-every every``."""
    if every >= 1:
        return (n - 1) % every == 0
    if n <= DENSE_STEPS:
        return True
    if n <= SPARSE_UNTIL:
        return n % SPARSE_EVERY == 0
    return n % LATE_EVERY == 0


def explains(n: int, every: int = AUTO) -> bool:
    """Whether the ``n``-th step, fingerprinted under ``--fingerprint-every every``, also takes the
    evidence that explains a divergence and weighs the global batch: every fingerprinted step of the
    automatic schedule; under an explicit interval, the first fingerprinted step at or after each step
    of the automatic schedule: never more often than the automatic schedule (its very steps for
    ``every`` 1), as often as the fingerprints allow (every fingerprinted step for an interval of
    ``LATE_EVERY`` or more)."""
    if not should_fingerprint(n, every):
        return False
    return every < 1 or _last_automatic(n) > n - every


def _last_automatic(n: int) -> int:
    """The last step at or before ``n`` that the automatic schedule fingerprints (``n`` >= 1)."""
    if n <= DENSE_STEPS:
        return n
    last = max(DENSE_STEPS, min(n, SPARSE_UNTIL) // SPARSE_EVERY * SPARSE_EVERY)
    return last if n <= SPARSE_UNTIL else max(last, n // LATE_EVERY * LATE_EVERY)


def describe(every: int) -> str:
    if every == 1:
        return "every step"
    if every > 1:
        return f"every {every} steps"
    return f"steps 1-{DENSE_STEPS}, every {SPARSE_EVERY}th to {SPARSE_UNTIL}, every {LATE_EVERY}th after"
