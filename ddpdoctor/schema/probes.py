"""Which checks a failed probe leaves incomplete, so the report says so: every check for a universal
probe, else the checks that declare they read it (``Check(probes=...)``). A third-party check's probe
is named by the check's id."""

from __future__ import annotations

from typing import Iterable, Mapping

ALL_CHECKS = "*"

# Built-in probes every check relies on: a failure of one leaves every check incomplete. The other
# probes are named by the checks that read their evidence (``Check(probes=...)``); a plugin's probe is
# recorded under its check's id.
UNIVERSAL_PROBES = frozenset({
    "lifecycle",
    "spawn",
    "device",  # a GPU script that is not simulated cannot run on a CPU-only machine at all
})


# Probes whose failure to install leaves the job unchecked: every other probe hangs on them, so the
# report says that ddpdoctor could not check the job (exit 2) instead of judging a script it did not see.
ESSENTIAL_PROBES = frozenset({"lifecycle"})


def not_checked_by(probe: str, phase: str) -> bool:
    """Whether this probe failure means nothing about the job could be checked."""
    return probe in ESSENTIAL_PROBES and phase == "install"


def checks_affected(probe: str, declared: Mapping[str, Iterable[str]]) -> tuple[str, ...]:
    """The check ids a failure of ``probe`` leaves incomplete ("*": every check), from what each check
    declares it reads (check id -> its probes). A probe no check declares is a plugin's, recorded under
    its check's id: only that check is left incomplete."""
    if probe in UNIVERSAL_PROBES:
        return (ALL_CHECKS,)
    readers = tuple(check_id for check_id, probes in declared.items() if probe in probes)
    if readers or any(probe in probes for probes in declared.values()):
        return readers
    return () if probe in _NO_CHECK_READS else (probe,)


# Probes that record evidence no check reads (`check --keep-evidence` writing the ranks' flight recorder dumps),
# or whose failure leaves the evidence whole (the fused fingerprint kernel: the per-tensor kernels took over).
FUSED_FINGERPRINT_KERNEL = "fused-fingerprint-kernel"
_NO_CHECK_READS = frozenset({"flight-recorder-dump", FUSED_FINGERPRINT_KERNEL})
