"""Names of the in-rank probes and the checks that rely on each, so a probe that failed makes the
report say which checks it left incomplete. A third-party check's probe is named by the check's id."""

from __future__ import annotations

ALL_CHECKS = "*"

PROBE_CHECKS: dict[str, tuple[str, ...]] = {
    "lifecycle": (ALL_CHECKS,),
    "ddp": ("gradient-sync", "buffer-sync", "unused-parameters", "uneven-inputs", "sampler-disjoint"),
    "optimizer": ("gradient-sync", "unused-parameters", "uneven-inputs", "config-sync", "optimizer-params"),
    "collectives": ("collective-hang", "rank0-checkpoint"),
    "data": ("sampler-disjoint", "set-epoch", "uneven-inputs"),
    "join": ("uneven-inputs",),
    "spawn": (ALL_CHECKS,),
    "checkpoint": ("rank0-checkpoint",),
    "watchdog": ("collective-hang",),
    "environment": ("env-consistency",),
    "device": (ALL_CHECKS,),  # a GPU script that is not simulated cannot run on a CPU-only machine at all
    "content": ("sampler-disjoint", "set-epoch"),
    "config": ("config-sync", "optimizer-params"),
    "wrapping": ("gradient-sync",),
    "data_parallel": ("not-distributed",),
    "flight-recorder": ("collective-hang",),  # `ddpdoctor analyze`: what a dump could not show (a full ring buffer)
    "flight-recorder-missing": ("collective-hang", "rank-failure"),  # `ddpdoctor analyze`: a rank left no dump
    "flight-recorder-dump": (),  # `check --keep-evidence` writing the ranks' dumps: no check relies on them
}


# Probes whose failure to install leaves the job unchecked: every other probe hangs on them, so the
# report says that ddpdoctor could not check the job (exit 2) instead of judging a script it did not see.
ESSENTIAL_PROBES = frozenset({"lifecycle"})


def not_checked_by(probe: str, phase: str) -> bool:
    """Whether this probe failure means nothing about the job could be checked."""
    return probe in ESSENTIAL_PROBES and phase == "install"


def checks_affected(probe: str) -> tuple[str, ...]:
    """The check ids a failure of ``probe`` leaves incomplete ("*": every check). A probe not in
    the table is a plugin's, recorded under its check's id: only that check is left incomplete."""
    return PROBE_CHECKS.get(probe, (probe,))
