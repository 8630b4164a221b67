"""What a probe knows about an object it does not own, kept beside the object, never on it.

An attribute or a hook left on the user's DataLoader, iterator or module travels with it: into a
pickle (``torch.save(model)``), a ``copy.deepcopy``, ``vars()``, TorchScript. A side table keyed
by identity travels nowhere, and an entry goes when its object is collected.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, Optional, TypeVar

__all__ = ["SideTable"]

V = TypeVar("V")


class SideTable(Generic[V]):
    """A map from objects to values by identity: the object's own ``__eq__``/``__hash__`` play no
    part, and an object that takes no weak reference is simply not remembered."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref, V]] = {}

    def get(self, obj: Any, default: Optional[V] = None) -> Optional[V]:
        item = self._items.get(id(obj))
        if item is None or item[0]() is not obj:
            return default
        return item[1]

    def __contains__(self, obj: Any) -> bool:
        item = self._items.get(id(obj))
        return item is not None and item[0]() is obj

    def set(self, obj: Any, value: V) -> bool:
        """Remember ``value`` for ``obj``; False when ``obj`` takes no weak reference."""
        key, items = id(obj), self._items

        def drop(ref: weakref.ref) -> None:
            current = items.get(key)
            if current is not None and current[0] is ref:
                del items[key]

        try:
            ref = weakref.ref(obj, drop)
        except TypeError:
            return False
        items[key] = (ref, value)
        return True

    def pop(self, obj: Any) -> Optional[V]:
        item = self._items.get(id(obj))
        if item is None or item[0]() is not obj:
            return None
        del self._items[id(obj)]
        return item[1]

    def clear(self) -> None:
        self._items.clear()

    def values(self) -> list[V]:
        return [value for ref, value in list(self._items.values()) if ref() is not None]

    def __len__(self) -> int:
        return len(self._items)
