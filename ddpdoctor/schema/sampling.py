"""Which optimizer steps (and training forwards) get fingerprinted.

Every rank must fingerprint the same steps, so the schedule is a pure function of the step
number. Divergence persists once it happens (replicas never re-converge by themselves), so a
sparse schedule still catches it, only later. The automatic schedule fingerprints every step while
structural bugs show (the first 20), then every 10th up to step 200, then every 50th: the probes'
cost amortizes to a few percent of training even for large models.
"""

from __future__ import annotations

AUTO = 0


def should_fingerprint(n: int, every: int = AUTO) -> bool:
    """Whether the ``n``-th (1-based) step is fingerprinted under ``--fingerprint-every every``."""
    if every >= 1:
        return (n - 1) % every == 0
    if n <= 20:
        return True
    if n <= 200:
        return n % 10 == 0
    return n % 50 == 0


def describe(every: int) -> str:
    if every == 1:
        return "every step"
    if every > 1:
        return f"every {every} steps"
    return "steps 1-20, every 10th to 200, every 50th after"
