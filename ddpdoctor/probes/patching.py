"""Reversible monkey-patching, used only where torch offers no public hook."""

from __future__ import annotations

import functools
from typing import Any, Callable

_PATCHES: list[tuple[Any, str, Any]] = []


def patch(owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)``; idempotent per attribute."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__ddpdoctor_wrapped__", False):
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
