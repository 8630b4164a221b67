"""Reversible monkey-patching, used only where torch offers no public hook.

A patch whose target does not exist in this torch version is recorded as a probe failure, so the
report says which checks it leaves incomplete instead of passing silently.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ddpdoctor.rank.recorder import Recorder

_PATCHES: list[tuple[Any, str, Any]] = []


def patch(rec: Recorder, probe: str, owner: Any, name: str, make_wrapper: Callable[[Any], Any], *,
          layer: bool = False) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)``; idempotent per attribute.

    ``layer=True``: the wrapper stays unmarked, so a probe installed later wraps it in turn instead of
    skipping it (device simulation sits under the probes: they see the script's own arguments)."""
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
        wrapper.__ddpdoctor_wrapped__ = not layer
    _PATCHES.append((owner, name, original))
    setattr(owner, name, wrapper)


def rebind(namespace: dict) -> None:
    """Point names a module imported before the probes were in (``from torch.distributed import
    init_process_group`` in a script an mp.spawn child re-imports) at the patched objects."""
    current = {id(original): getattr(owner, name) for owner, name, original in _PATCHES}
    for key, value in list(namespace.items()):
        replacement = current.get(id(value))
        if replacement is not None and replacement is not value:
            namespace[key] = replacement


def restore_all() -> None:
    """Undo every patch, newest first."""
    while _PATCHES:
        owner, name, original = _PATCHES.pop()
        setattr(owner, name, original)
