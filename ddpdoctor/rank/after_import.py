"""Run code right after a module's first import, without importing it first.

The rank bootstrap installs its probes when the script imports torch (a script that never does
pays nothing for it), and the checkpoint probe patches torch.distributed.checkpoint when the
script imports that (about half a CPU second a script without DCP never pays).
"""

from __future__ import annotations

import importlib.abc
import sys
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once ``name`` has been imported (then leaves sys.meta_path).

    It finds nothing itself: it asks the other finders for the module's spec and wraps that
    loader's ``exec_module`` once, so the callback runs on the fully executed module."""

    def __init__(self, name: str, callback: Callable[[Any], None], *,
                 on_found: Optional[Callable[[], None]] = None,
                 around: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.name = name
        self.callback = callback
        self.on_found = on_found  # called as the import begins, before the module's code runs
        self.around = around  # a context the module's code and then the callback run in

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if self.on_found is not None:
            try:
                self.on_found()
            except Exception:
                pass
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec
        callback, around = self.callback, self.around

        def exec_module(module: Any) -> None:
            with around():
                try:
                    original(module)
                finally:
                    loader.__dict__.pop("exec_module", None)  # the loader as it was, module.__loader__ included
                try:
                    callback(module)
                except Exception:
                    pass  # a probe never breaks the script's import

        try:
            loader.exec_module = exec_module  # this loader instance only, until it ran
        except (AttributeError, TypeError):
            return spec  # a loader that takes no attributes: the module stays unpatched, as it would be
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def insert(self) -> "AfterImport":
        """Put the hook first on sys.meta_path (it leaves by itself once the module is found)."""
        sys.meta_path.insert(0, self)
        return self
