"""Reversible monkey-patching, used only where torch offers no public hook.

A patch whose target does not exist in this torch version is recorded as a probe failure, so the
report says which checks it leaves incomplete instead of passing silently.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ddpdoctor.rank.recorder import Recorder

_PATCHES: list[tuple[Any, str, Any]] = []


def patch(rec: Recorder, probe: str, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)``; idempotent per attribute."""
    original = getattr(owner, name, None)
    if original is None:
        owner_name = getattr(owner, "__name__", type(owner).__name__)
        rec.probe_failed(probe, AttributeError(f"{owner_name}.{name} does not exist in this torch version"),
                         target=f"{owner_name}.{name}", phase="install")
        return
    if getattr(original, "__ddpdoctor_wrapped__", False):
        return
    wrapper = make_wrapper(original)
    if callable(wrapper) and not isinstance(wrapper, type):
        try:
            functools.update_wrapper(wrapper, original)
        except (AttributeError, TypeError):
            pass
        wrapper.__ddpdoctor_wrapped__ = True
    _PATCHES.append((owner, name, original))
    setattr(owner, name, wrapper)


def restore_all() -> None:
    """Undo every patch, newest first."""
    while _PATCHES:
        owner, name, original = _PATCHES.pop()
        setattr(owner, name, original)
