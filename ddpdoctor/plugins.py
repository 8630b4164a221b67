"""What is installed, found through entry points: checks (``ddpdoctor.checks``, the built-ins
registered in ddpdoctor's own pyproject.toml exactly as a plugin registers its own, and found the
same way, as pytest loads its built-in plugins) and third-party in-rank probes (``ddpdoctor.probes``,
or a check's ``probe``). The built-in probes are one ordered tuple on the rank side instead: their
install order matters (the device simulation first) and entry points have none.

Side-neutral: the standard library only, no import of the supervisor, rank or analysis side, so a
rank process can list the probes to install without loading any check. Loading and judging check
objects is the analysis side's (ddpdoctor.analysis.registry).
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Iterable

__all__ = ["CHECKS_GROUP", "PROBES_GROUP", "DISABLE_PLUGINS_ENV", "plugins_disabled", "is_builtin",
           "entry_points", "plugin_probes"]

CHECKS_GROUP = "ddpdoctor.checks"
PROBES_GROUP = "ddpdoctor.probes"
DISABLE_PLUGINS_ENV = "DDPDOCTOR_DISABLE_PLUGINS"
_BUILTIN_PREFIX = "ddpdoctor."


def plugins_disabled() -> bool:
    """DDPDOCTOR_DISABLE_PLUGINS=1: built-ins only, to rule a plugin out as a cause."""
    return os.environ.get(DISABLE_PLUGINS_ENV, "").strip().lower() not in ("", "0", "false", "no")


def is_builtin(ep: metadata.EntryPoint) -> bool:
    return ep.value.startswith(_BUILTIN_PREFIX)


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The group's entry points, built-ins first in the order ddpdoctor declares them; plugins' left
    out under DDPDOCTOR_DISABLE_PLUGINS=1."""
    found: Iterable[metadata.EntryPoint] = metadata.entry_points(group=group)
    points = [ep for ep in found if is_builtin(ep) or not plugins_disabled()]
    return sorted(points, key=lambda ep: not is_builtin(ep))  # stable: declaration order within each


def plugin_probes() -> list[tuple[str, str]]:
    """(check id, "module:function") of every third-party probe: registered in the ``ddpdoctor.probes``
    group under its check's id, or (check API 1) named by the check's ``probe``. Loading a plugin check
    here imports only that plugin; one that fails to load is the analysis side's to report."""
    probes = {ep.name: ep.value for ep in entry_points(PROBES_GROUP) if not is_builtin(ep)}
    for ep in entry_points(CHECKS_GROUP):
        if is_builtin(ep) or ep.name in probes:
            continue
        try:
            target = getattr(ep.load(), "probe", None)
        except Exception:
            continue
        if isinstance(target, str) and ":" in target:
            probes[ep.name] = target
    return sorted(probes.items())
