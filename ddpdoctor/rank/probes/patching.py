"""Reversible monkey-patching, used only where torch offers no public hook.

A patch whose target does not exist in this torch version is recorded as a probe failure, so the
report says which checks it leaves incomplete instead of passing silently.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from ddpdoctor.rank.recorder import Recorder

_PATCHES: list[tuple[Any, str, Any]] = []
_WRAPPED_BY = "__ddpdoctor_wrapped__"  # on a wrapper: the probes whose wrappers it holds, its own included


def patch(rec: Recorder, probe: str, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)``; idempotent per probe and attribute.

    A probe installed twice wraps once; different probes on one attribute stack, the first installed
    innermost (device simulation installs first, so the other probes see the script's own arguments).
    """
    original = getattr(owner, name, None)
    if original is None:
        owner_name = getattr(owner, "__name__", type(owner).__name__)
        rec.probe_failed(probe, AttributeError(f"{owner_name}.{name} does not exist in this torch version"),
                         target=f"{owner_name}.{name}", phase="install")
        return
    wrapped_by = getattr(original, _WRAPPED_BY, None)
    wrapped_by = wrapped_by if isinstance(wrapped_by, frozenset) else frozenset()
    if probe in wrapped_by:
        return
    wrapper = make_wrapper(original)
    if callable(wrapper) and not isinstance(wrapper, type):
        try:
            functools.update_wrapper(wrapper, original)
        except (AttributeError, TypeError):
            pass
        setattr(wrapper, _WRAPPED_BY, wrapped_by | {probe})
    static = isinstance(owner, type) and isinstance(inspect.getattr_static(owner, name, None), staticmethod)
    if static:  # a class's staticmethod stays one (called on instances too), and is restored as one
        original, wrapper = inspect.getattr_static(owner, name), staticmethod(wrapper)
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
