"""Which optimizer steps (and training forwards) get fingerprinted.

Every rank must fingerprint the same steps, so the schedule is a pure function of the step
number. Divergence persists once it happens (replicas never re-converge by themselves), so a
sparse schedule still catches it, only later. The automatic schedule fingerprints every step while
structural bugs show (the first 10: a missing all-reduce, an unsynchronized init or a rank-dependent
setting shows at step 1), then every 10th up to step 200, then every 50th: the probes' cost
amortizes to a few percent of training even for large models and short jobs. A fingerprinted step
reads every gradient and parameter once (about 10% of a CPU step); with 20 dense steps a 40-step job
fingerprinted half its steps, and a bug that first shows at steps 11-19 would be reported at most
nine steps later, at step 20.
"""

from __future__ import annotations

AUTO = 0
DENSE_STEPS = 10  # the automatic schedule fingerprints steps 1..DENSE_STEPS, every one


def should_fingerprint(n: int, every: int = AUTO) -> bool:
    """Whether the ``n``-th (1-based) step is fingerprinted under ``--fingerprint-every every``."""
    if every >= 1:
        return (n - 1) % every == 0
    if n <= DENSE_STEPS:
        return True
    if n <= 200:
        return n % 10 == 0
    return n % 50 == 0


def describe(every: int) -> str:
    if every == 1:
        return "every step"
    if every > 1:
        return f"every {every} steps"
    return f"steps 1-{DENSE_STEPS}, every 10th to 200, every 50th after"
