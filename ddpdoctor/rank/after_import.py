"""Run code right after a module's first import, without importing it first.

The rank bootstrap installs its probes when the script imports torch (a script that never does
pays nothing for it), and the checkpoint probe patches torch.distributed.checkpoint when the
script imports that (about half a CPU second a script without DCP never pays).

A look-up is not an import: libraries ask ``importlib.util.find_spec("torch")`` on import
(transformers' ``is_torch_available``, TRL, accelerate) long before they import torch, and
that call reaches the finders on ``sys.meta_path`` exactly as the import does. So the hook stays
until the module's code has really run, and wraps the loader of every spec it hands out: whichever
of them executes the module first fires the callback.
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
    loader's ``exec_module`` (on the loader instance, until it ran), so the callback runs on the
    fully executed module."""

    def __init__(self, name: str, callback: Callable[[Any], None], *,
                 on_found: Optional[Callable[[], None]] = None,
                 around: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.name = name
        self.callback = callback
        self.on_found = on_found  # called as the module's code starts to run, before it runs
        self.around = around  # a context the module's code and then the callback run in
        self.fired = False
        self._finding = False  # asking the other finders: a finder that looks itself up meets None here

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.fired or self._finding:
            return None
        self._finding = True
        try:
            spec = self._spec_from_others(fullname, path, target)
        finally:
            self._finding = False
        if spec is not None:
            self._wrap(spec.loader)
        return spec

    def _spec_from_others(self, fullname: str, path: Any, target: Any) -> Any:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                return spec
        return None

    def _wrap(self, loader: Any) -> None:
        original = getattr(loader, "exec_module", None)
        if original is None or getattr(original, "_after_import_hook", None) is self:
            return  # no loader to wrap, or this instance is wrapped already (a finder with one loader for all)

        def exec_module(module: Any) -> None:
            if self.fired:  # another spec's loader ran first: this is no first import
                loader.__dict__.pop("exec_module", None)
                original(module)
                return
            if self.on_found is not None:
                try:
                    self.on_found()
                except Exception:
                    pass
            with self.around():
                try:
                    original(module)
                finally:
                    loader.__dict__.pop("exec_module", None)  # the loader as it was, module.__loader__ included
                self.fired = True
                self.remove()
                try:
                    self.callback(module)
                except Exception:
                    pass  # a probe never breaks the script's import

        exec_module._after_import_hook = self  # type: ignore[attr-defined]
        try:
            loader.exec_module = exec_module  # this loader instance only, until it ran
        except (AttributeError, TypeError):
            pass  # a loader that takes no attributes: the module stays unpatched, which the bootstrap reports

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def insert(self) -> "AfterImport":
        """Put the hook first on sys.meta_path (it leaves by itself once the module ran)."""
        sys.meta_path.insert(0, self)
        return self
