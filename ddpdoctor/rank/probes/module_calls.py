"""Calls of chosen module instances, seen without a hook on the instance.

The DDP probes must see every call of the module a DDP wrapper wraps (through the wrapper, or
bypassing it). A forward pre-hook on that module would do it, but a hook is the module's own
state: ``torch.save(model)`` pickles it (and fails on a closure), ``copy.deepcopy`` copies it into
an EMA with the original's counters, ``torch.jit.script`` tries to compile it, ``torch.export``
and ``torch.compile`` trace it, and some of torch's fast paths (``nn.TransformerEncoder``, CUDA
graphs) refuse modules with hooks. So the watch is kept in a side table, and the module's *class*
gets a ``__call__`` shim that looks the instance up there: nothing on the instance changes, a copy
is not watched, and every other instance of the class pays one dictionary look-up.

Calls made while a tracer or compiler runs the module (torch.compile, torch.export, jit.trace,
FX, fake tensors) are not forwards of the job and are not reported. The shim's own frame is
skipped by TorchDynamo, so a compiled model compiles exactly what it compiled without ddpdoctor.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from ddpdoctor.rank.probes.sidetable import SideTable

__all__ = ["watch", "unwatch_all", "traced", "skip_in_dynamo"]

Callback = Callable[[torch.nn.Module, tuple, dict], None]

_WATCHED: SideTable[list[Callback]] = SideTable()
_SHIMMED: dict[type, Any] = {}  # class -> its own __call__ before the shim (_INHERITED: it had none)
_INHERITED = object()
_SHIM_MARK = "__ddpdoctor_call_shim__"


def traced() -> bool:
    """Whether a tracer or compiler, not the job, is running the module now."""
    try:
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return True
        fx = sys.modules.get("torch.fx._symbolic_trace")
        # The flag itself: torch's is_fx_tracing() logs a warning into the script's output when called.
        if fx is not None and getattr(fx, "_is_fx_tracing_flag", False):
            return True
        return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    except Exception:
        return False


def watch(module: torch.nn.Module, callback: Callback) -> bool:
    """Call ``callback(module, args, kwargs)`` before every real call of this very instance;
    False when it cannot be watched (it takes no weak reference)."""
    callbacks = _WATCHED.get(module)
    if callbacks is None:
        callbacks = []
        if not _WATCHED.set(module, callbacks):
            return False
    callbacks.append(callback)
    _shim(type(module))
    return True


def unwatch_all() -> None:
    """Forget every watch and give every class its own ``__call__`` back."""
    for cls, own in list(_SHIMMED.items()):
        if own is _INHERITED:
            if getattr(vars(cls).get("__call__"), _SHIM_MARK, False):
                delattr(cls, "__call__")
        else:
            setattr(cls, "__call__", own)
    _SHIMMED.clear()
    _WATCHED.clear()


def _shim(cls: type) -> None:
    if getattr(getattr(cls, "__call__", None), _SHIM_MARK, False):
        return  # the class or a base already calls through a shim: one look-up per call is enough
    own = vars(cls).get("__call__", _INHERITED)
    watched = _WATCHED

    if own is _INHERITED:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            callbacks = watched.get(self)
            if callbacks is not None and not traced():
                _run(callbacks, self, args, kwargs)
            # super(), resolved at call time: a tracer that patches Module.__call__ (FX) still sees the call
            return super(cls, self).__call__(*args, **kwargs)
    else:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            callbacks = watched.get(self)
            if callbacks is not None and not traced():
                _run(callbacks, self, args, kwargs)
            return own(self, *args, **kwargs)

    setattr(__call__, _SHIM_MARK, True)
    __call__.__qualname__ = f"{cls.__qualname__}.__call__"
    skip_in_dynamo(__call__)
    _SHIMMED[cls] = own
    setattr(cls, "__call__", __call__)


def _run(callbacks: list[Callback], module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    for callback in callbacks:
        try:
            callback(module, args, kwargs)
        except Exception:
            pass  # each callback guards itself and records its failure; the call goes on regardless


def skip_in_dynamo(function: Callable) -> None:
    """TorchDynamo runs this function's frames eagerly and compiles what it calls, as it would
    without the probe in between (a no-op before torch._dynamo is imported)."""
    dynamo = sys.modules.get("torch._dynamo")
    skip = getattr(dynamo, "skip", None) if dynamo is not None else None
    if skip is None:
        decorators = sys.modules.get("torch._dynamo.decorators")
        skip = getattr(decorators, "skip", None) if decorators is not None else None
    if skip is not None:
        try:
            skip(function)
        except Exception:
            pass
