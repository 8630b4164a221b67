"""Probes on torch.save / torch.load and torch.distributed.checkpoint.

Each save or load records the resolved path, size, call site and the rank's collective sequence
number before and after, so the analyzer can order a write on one rank against a read on another
(happens-before through collectives). Saves also carry a fingerprint of the saved tensors, to tell
identical per-rank copies from distinct per-rank state. Nothing the script writes is changed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from typing import Any, Callable, Optional

import torch

from ddpdoctor.rank import callsite
from ddpdoctor.rank.after_import import AfterImport
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import DistributedCheckpoint, Load, Save

PROBE = "checkpoint"
DCP = "torch.distributed.checkpoint"

_inside = threading.local()  # set while a save/load (or a DCP call) is running: inner calls are its own
MAX_TENSORS = 10_000
STATE_KEYS = ("state_dict", "model", "model_state_dict", "module")


def _path_of(f: Any) -> Optional[str]:
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and not name.startswith("<") else None


def _tensors(obj: Any, out: list, depth: int = 0) -> None:
    if len(out) >= MAX_TENSORS or depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensors(value, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _tensors(value, out, depth + 1)


def _tensor_sum(t: torch.Tensor) -> float:
    """A float64 sum of one tensor on its own device; NaN for tensors that cannot be summed (meta,
    sparse, quantized, exotic subclasses), which then compare by shape alone."""
    try:
        if t.is_meta or t.numel() == 0:
            return 0.0
        value = t.detach()
        if value.is_complex():
            value = torch.view_as_real(value)
        return float(value.sum(dtype=torch.float64) if value.is_floating_point() else value.double().sum())
    except Exception:
        return float("nan")


@torch.no_grad()
def state_fingerprint(obj: Any) -> Optional[str]:
    """Digest of every tensor's float64 sum and shape: equal for identical replicas' state."""
    tensors: list[torch.Tensor] = []
    _tensors(obj, tensors)
    if not tensors:
        return None
    sums = [_tensor_sum(t) for t in tensors]
    shapes = [tuple(t.shape) for t in tensors]
    return hashlib.blake2b(repr((sums, shapes)).encode(), digest_size=8).hexdigest()


def module_prefixed(obj: Any) -> bool:
    """Whether a state dict (possibly nested under a usual key) was saved from the DDP wrapper."""
    if not isinstance(obj, dict) or not obj:
        return False
    keys = [k for k in obj if isinstance(k, str)]
    if keys and all(k.startswith("module.") for k in keys):
        return True
    return any(module_prefixed(obj[k]) for k in STATE_KEYS if isinstance(obj.get(k), dict))


def install(rec: Recorder) -> Optional[Callable[[], None]]:
    def wrap_save(original):
        def save(obj, f, *args, **kwargs):
            if getattr(_inside, "active", False):
                return original(obj, f, *args, **kwargs)
            _inside.active = True
            try:
                seq_start = rec.collective_seq
                path, site = None, []
                with rec.guard(PROBE, "torch.save"):
                    path, site = _path_of(f), callsite.caller_site(3)
                    rec.emit(Save(path=path, seq_start=seq_start, seq_end=seq_start, site=site, done=False))
                started = time.perf_counter()
                result = original(obj, f, *args, **kwargs)
                duration = time.perf_counter() - started
                with rec.guard(PROBE, "torch.save"):
                    rec.emit(Save(path=path, bytes=os.path.getsize(path) if path and os.path.isfile(path) else None,
                                  seq_start=seq_start, seq_end=rec.collective_seq, fingerprint=state_fingerprint(obj),
                                  module_prefix=module_prefixed(obj), site=site, dur_s=round(duration, 6)))
                return result
            finally:
                _inside.active = False

        return save

    def wrap_load(original):
        def load(f, *args, **kwargs):
            if getattr(_inside, "active", False):
                return original(f, *args, **kwargs)
            _inside.active = True
            event = None
            with rec.guard(PROBE, "torch.load"):
                path = _path_of(f)
                map_location = kwargs.get("map_location", args[0] if args else None)
                event = Load(path=path, existed=os.path.exists(path) if path else None, seq_start=rec.collective_seq,
                             map_location=None if map_location is None else str(map_location),
                             site=callsite.caller_site(3))
            try:
                result = original(f, *args, **kwargs)
            except BaseException as exc:
                if event is not None:
                    event.error = f"{type(exc).__name__}: {exc}"[:300]
                    with rec.guard(PROBE, "torch.load"):
                        rec.emit(event)
                raise
            finally:
                _inside.active = False
            if event is not None:
                with rec.guard(PROBE, "torch.load"):
                    event.module_prefix = module_prefixed(result)
                    rec.emit(event)
            return result

        return load

    def wrap_dcp(name: str):
        def wrap(original):
            def dcp_call(*args, **kwargs):
                if getattr(_inside, "active", False):
                    return original(*args, **kwargs)
                _inside.active = True
                try:
                    with rec.guard(PROBE, f"torch.distributed.checkpoint.{name}"):
                        checkpoint_id = kwargs.get("checkpoint_id")
                        rec.emit(DistributedCheckpoint(op=name, site=callsite.caller_site(2),
                                                       path=str(checkpoint_id) if checkpoint_id is not None else None))
                    return original(*args, **kwargs)
                finally:
                    _inside.active = False

            return dcp_call

        return wrap

    for owner in (torch, torch.serialization):
        patch(rec, PROBE, owner, "save", wrap_save)
        patch(rec, PROBE, owner, "load", wrap_load)

    def patch_dcp(dcp: Any) -> None:
        for name in ("save", "load", "async_save", "save_state_dict", "load_state_dict"):
            if hasattr(dcp, name):  # the deprecated *_state_dict names may be gone
                patch(rec, PROBE, dcp, name, wrap_dcp(name))

    # Importing torch.distributed.checkpoint costs every rank about half a CPU second (it pulls in
    # DTensor and torch.distributed.elastic) that a script without DCP never pays: patch it when the
    # script imports it, not before.
    if DCP in sys.modules:
        patch_dcp(sys.modules[DCP])
        return None
    def on_import(module: Any) -> None:
        with rec.guard(PROBE, DCP):
            patch_dcp(module)

    return AfterImport(DCP, on_import).insert().remove
