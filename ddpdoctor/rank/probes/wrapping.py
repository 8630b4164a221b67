"""Probes on how a DDP module is used after wrapping: what gradient-sync needs to name the cause
of a divergence, and the gradients as DDP's all-reduce left them.

- DDP constructed again around a module another DDP already wraps (``DDPRewrap``);
- forwards of the wrapped module with gradients enabled outside its wrapper (``DDPBypass``, the
  line of the first such forward per call site);
- ``nn.Module.to/half/float/cpu/cuda/...`` on a DDP module after wrapping (``ModuleConversion``):
  its parameters get new storage while DDP's hooks and buckets keep the old. Under the CUDA
  simulation a device move changes nothing on the CPU, so the call itself is recorded;
- communication hooks (``register_comm_hook``);
- parameters frozen when DDP was built made trainable again (``Module.requires_grad_(True)``,
  ``Optimizer.add_param_group``, ``Unfrozen``): DDP's reducer never took them;
- on sampled iterations (at the automatic schedule's pace under ``--fingerprint-every``:
  ``sampling.explains``), the fingerprints of the gradients at the end of DDP's backward, after its
  all-reduce finished and before any user code ran: an autograd callback queued from a hook on the
  forward's output queues a second one, which runs after the callback DDP queues to finish its
  reduction. The optimizer probe compares them with the gradients it fingerprints before the step,
  by value (version counters miss writes through ``.data`` and GradScaler's unscale): whether the
  gradients already differed across ranks out of the all-reduce, or were changed afterwards.

Per forward: two listeners of the DDP probe's forward and a flag (a hook on the output's tensors on
sampled iterations only); per sampled iteration one more read of the gradients.
"""

from __future__ import annotations

import functools
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves

from ddpdoctor.rank import callsite
from ddpdoctor.rank import fingerprint as fingerprints
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes import module_calls
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.torch_modes import outside_torch_modes
from ddpdoctor.schema.events import CommHook, DDPBypass, DDPRewrap, ModuleConversion, Unfrozen

PROBE = "wrapping"
CONVERSIONS = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "xpu", "mtia", "ipu"})
MAX_OUTPUT_HOOKS = 8


@dataclass
class Snapshot:
    """The sampled fingerprints of one DDP module's gradients at the end of a synchronized backward
    (a few percent of a full read: the full one is taken before the step)."""

    pending: fingerprints.Pending
    owner_steps: int  # OWNER_STEPS of this DDP module when taken: valid until one of its optimizers steps


@dataclass
class _Wrapped:
    index: int
    params: list  # parameters that required grad at wrapping, in DDP's order
    positions: dict = field(default_factory=dict)  # id(parameter) -> position in params
    bypasses: int = 0
    bypass_sites: set = field(default_factory=set)


WRAPPED: dict[int, _Wrapped] = {}  # DDP index ->
BY_OBJECT: dict[int, int] = {}  # id(DDP wrapper) -> DDP index
ROOTS: dict[int, int] = {}  # id(wrapper, or a module it wraps) -> DDP index: what a conversion must reach
INNER: dict[int, tuple] = {}  # id(wrapped module) -> (weakref to it, first DDP index wrapping it)
SNAPSHOTS: dict[int, Snapshot] = {}
NEXT_SAMPLED: dict[int, bool] = {}  # DDP index -> whether its optimizers' next step is fingerprinted
OWNER_STEPS: dict[int, int] = {}  # DDP index -> steps of optimizers owning it so far
OWNED: set[int] = set()  # DDP modules an optimizer stepped (the others are snapshot once, not every iteration)
CONVERSION_SITES: set = set()  # (DDP index, method, call site) already recorded
UNFREEZE_SITES: set = set()  # (DDP index, call, call site) already recorded
MAX_UNFROZEN_NAMES = 32


class _Depth:
    ddp_forward = 0  # inside a DDP wrapper's forward: the wrapped module's forward is not a bypass
    apply = 0
    hits: Optional[set] = None


def install(rec: Recorder) -> Callable[[], None]:
    listener = functools.partial(_attach, rec)
    before, after = _enter, functools.partial(_leave, rec)
    ddp_probe.ATTACH_LISTENERS.append(listener)
    ddp_probe.BEFORE_FORWARD.append(before)
    ddp_probe.AFTER_FORWARD.append(after)

    def wrap_apply(original):
        def _apply(self, fn, *args, **kwargs):
            if _Depth.apply:
                if _Depth.hits is not None and id(self) in ROOTS:
                    _Depth.hits.add(ROOTS[id(self)])
                return original(self, fn, *args, **kwargs)
            _Depth.apply += 1
            _Depth.hits = set()
            first = before = None
            if ROOTS:
                if id(self) in ROOTS:
                    _Depth.hits.add(ROOTS[id(self)])
                first = next(self.parameters(), None)
                before = _tensor_state(first)
            try:
                return original(self, fn, *args, **kwargs)
            finally:
                hits, _Depth.hits = _Depth.hits, None
                _Depth.apply -= 1
                if hits:
                    with rec.guard(PROBE, "Module._apply"):
                        _converted(rec, hits, before, _tensor_state(first), sys._getframe(1))

        return _apply

    patch(rec, PROBE, torch.nn.Module, "_apply", wrap_apply)

    def wrap_register_comm_hook(original):
        def register_comm_hook(self, state, hook):
            with rec.guard(PROBE, "register_comm_hook"):
                rec.emit(CommHook(ddp=BY_OBJECT.get(id(self)), name=getattr(hook, "__qualname__", type(hook).__name__),
                                  module=str(getattr(hook, "__module__", "") or ""),
                                  site=callsite.user_frames(sys._getframe(1), 2)))
            return original(self, state, hook)

        return register_comm_hook

    patch(rec, PROBE, DistributedDataParallel, "register_comm_hook", wrap_register_comm_hook)

    def wrap_requires_grad(original):
        def requires_grad_(self, requires_grad=True):
            result = original(self, requires_grad)
            if requires_grad and ddp_probe.FROZEN_AT_WRAP:
                with rec.guard(PROBE, "Module.requires_grad_"):
                    _unfrozen(rec, "requires_grad_", self.parameters(), sys._getframe(1))
            return result

        return requires_grad_

    def wrap_add_param_group(original):
        def add_param_group(self, param_group):
            result = original(self, param_group)
            caller = sys._getframe(1)
            in_own_init = caller.f_code.co_name == "__init__" and caller.f_locals.get("self") is self
            if ddp_probe.FROZEN_AT_WRAP and not in_own_init:
                with rec.guard(PROBE, "Optimizer.add_param_group"):
                    _unfrozen(rec, "add_param_group", self.param_groups[-1]["params"], caller)
            return result

        return add_param_group

    patch(rec, PROBE, torch.nn.Module, "requires_grad_", wrap_requires_grad)
    patch(rec, PROBE, torch.optim.Optimizer, "add_param_group", wrap_add_param_group)

    def finish() -> None:
        for listeners, own in ((ddp_probe.ATTACH_LISTENERS, listener), (ddp_probe.BEFORE_FORWARD, before),
                               (ddp_probe.AFTER_FORWARD, after)):
            if own in listeners:
                listeners.remove(own)

    return finish


def _enter(ddp: DistributedDataParallel, state: "ddp_probe.DDPState", inputs: tuple, kwargs: dict) -> None:
    _Depth.ddp_forward += 1


def _leave(rec: Recorder, ddp: DistributedDataParallel, state: "ddp_probe.DDPState", output: Any) -> None:
    _Depth.ddp_forward = max(0, _Depth.ddp_forward - 1)
    index = state.index
    if output is not None and torch.is_grad_enabled() and ddp.require_backward_grad_sync \
            and NEXT_SAMPLED.get(index, True):
        with rec.guard(PROBE, "reduced gradients"):
            _hook_backward_end(rec, index, output)


def _attach(rec: Recorder, ddp: DistributedDataParallel, state: "ddp_probe.DDPState") -> None:
    index = state.index
    inner = ddp.module
    params = [p for _, p in inner.named_parameters() if p.requires_grad]
    wrapped = _Wrapped(index=index, params=params,
                       positions={id(p): i for i, p in enumerate(params)})
    WRAPPED[index] = wrapped
    BY_OBJECT[id(ddp)] = index
    ROOTS[id(ddp)] = index
    previous = INNER.get(id(inner))
    first_wrap = previous is None or previous[0]() is not inner
    if first_wrap:
        INNER[id(inner)] = (weakref.ref(inner), index)
        for module in inner.modules():
            ROOTS.setdefault(id(module), index)
    else:
        rec.emit(DDPRewrap(ddp=index, previous=previous[1]))

    if first_wrap:
        first = INNER[id(inner)][1]

        def inner_forward(module, inputs, kwargs):
            if _Depth.ddp_forward or not torch.is_grad_enabled():
                return
            with rec.guard(PROBE, "bypass"):
                _bypassed(rec, WRAPPED.get(first), sys._getframe(1))

        module_calls.watch(inner, inner_forward)


def _unfrozen(rec: Recorder, call: str, params: Any, frame) -> None:
    """Parameters frozen when their DDP module was built, made trainable again (or handed to an
    optimizer): once per DDP module, call and call site."""
    by_ddp: dict[int, list[str]] = {}
    for p in params:
        entry = ddp_probe.FROZEN_AT_WRAP.get(id(p))
        if entry is not None and p.requires_grad:
            by_ddp.setdefault(entry[0], []).append(entry[1])
    site = callsite.user_frames(frame, 2)
    for index, names in sorted(by_ddp.items()):
        key = (index, call, tuple((s["file"], s["line"]) for s in site[:1]))
        if key in UNFREEZE_SITES:
            continue
        UNFREEZE_SITES.add(key)
        rec.emit(Unfrozen(ddp=index, names=names[:MAX_UNFROZEN_NAMES], call=call, site=site))


def _bypassed(rec: Recorder, wrapped: Optional[_Wrapped], frame) -> None:
    if wrapped is None:
        return
    wrapped.bypasses += 1
    site = callsite.user_frames(frame, 2)
    key = tuple((s["file"], s["line"]) for s in site[:1])
    if key not in wrapped.bypass_sites:
        wrapped.bypass_sites.add(key)
        rec.emit(DDPBypass(ddp=wrapped.index, forwards=wrapped.bypasses, site=site))


def _tensor_state(tensor: Optional[torch.Tensor]) -> Optional[tuple]:
    if tensor is None:
        return None
    return str(tensor.dtype), str(tensor.device), tensor.data_ptr() if tensor.device.type != "meta" else 0


def _converted(rec: Recorder, hits: set, before: Optional[tuple], after: Optional[tuple], frame) -> None:
    """Record a conversion that reached DDP modules: which method, what it asked for, whether the
    parameters got new storage (the converted module's first parameter tells)."""
    method_frame = frame
    while method_frame is not None and method_frame.f_code.co_name == "_apply":
        method_frame = method_frame.f_back
    method = method_frame.f_code.co_name if method_frame is not None else ""
    if method not in CONVERSIONS:
        return
    target, device_move = _target(method, method_frame.f_locals if method_frame is not None else {})
    site = callsite.user_frames(method_frame, 2)
    for index in sorted(hits):
        key = (index, method, tuple((s["file"], s["line"]) for s in site[:1]))
        if key in CONVERSION_SITES:
            continue
        CONVERSION_SITES.add(key)
        rec.emit(ModuleConversion(
            ddp=index, method=method, target=target, device_move=device_move,
            swapped=before is not None and before != after,
            dtype_before=before[0] if before else "", dtype_after=after[0] if after else "",
            device_before=before[1] if before else "", device_after=after[1] if after else "", site=site))


def _target(method: str, frame_locals: dict) -> tuple[str, bool]:
    """What a conversion asked for, from its method and (for ``to``) its own arguments."""
    if method in ("cuda", "cpu", "xpu", "mtia", "ipu"):
        return method, True
    if method in ("half", "float", "double", "bfloat16"):
        return {"half": "torch.float16", "float": "torch.float32", "double": "torch.float64",
                "bfloat16": "torch.bfloat16"}[method], False
    values = list(frame_locals.get("args", ())) + list((frame_locals.get("kwargs") or {}).values())
    if method == "type":
        values = [frame_locals.get("dst_type")]
    parts, device_move = [], False
    for value in values:
        if isinstance(value, torch.dtype):
            parts.append(str(value))
        elif isinstance(value, torch.Tensor):
            parts.append(f"like a {value.dtype} tensor on {value.device}")
            device_move = True
        elif isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool)):
            parts.append(str(value))
            device_move = True
    return ", ".join(parts), device_move


def _hook_backward_end(rec: Recorder, index: int, output: Any) -> None:
    """Hooks on the forward's outputs that, at the start of their backward, queue the snapshot to
    run once DDP finished reducing."""
    queued = [False]

    def at_backward_start(grad):
        if queued[0]:
            return None
        queued[0] = True
        try:
            engine = torch.autograd.Variable._execution_engine
            # Queued now, this runs before the callback DDP queues later in this backward; from it, the
            # snapshot is queued behind DDP's.
            engine.queue_callback(lambda: _queue_snapshot(rec, engine, index))
        except Exception as exc:
            rec.probe_failed(PROBE, exc, target="reduced gradients")
        return None

    at_backward_start.__torch_unserializable__ = True  # type: ignore[attr-defined]  # torch.save(output) stays quiet
    count = 0
    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            leaf.register_hook(at_backward_start)
            count += 1
            if count >= MAX_OUTPUT_HOOKS:
                break


def _queue_snapshot(rec: Recorder, engine, index: int) -> None:
    try:
        engine.queue_callback(lambda: _snapshot(rec, index))
    except Exception as exc:
        rec.probe_failed(PROBE, exc, target="reduced gradients")


def _snapshot(rec: Recorder, index: int) -> None:
    with rec.guard(PROBE, "reduced gradients"), outside_torch_modes():
        wrapped = WRAPPED.get(index)
        if wrapped is None:
            return
        SNAPSHOTS[index] = Snapshot(pending=fingerprints.start([p.grad for p in wrapped.params], sampled=True),
                                    owner_steps=OWNER_STEPS.get(index, 0))
        if index not in OWNED:
            NEXT_SAMPLED[index] = False


def reduced_for(params: list, ddp_indices: list[int]) -> Optional["Reduced"]:
    """Where each of an optimizer's parameters is in the snapshots of its DDP modules; None when no
    valid snapshot covers any of them. The caller launches the sample of the gradients before the
    step (``before_step``), with their full fingerprints."""
    snapshots = []
    for index in ddp_indices:
        snap = SNAPSHOTS.get(index)
        if snap is not None and snap.owner_steps == OWNER_STEPS.get(index, 0):
            snapshots.append((index, snap))
    if not snapshots:
        return None
    where: list = []
    for p in params:
        found = None
        for number, (index, _) in enumerate(snapshots):
            position = WRAPPED[index].positions.get(id(p))
            if position is not None:
                found = (number, position)
                break
        where.append(found)
    return Reduced(pendings=[snap.pending for _, snap in snapshots], where=where)


@dataclass
class Reduced:
    """An optimizer's parameters in DDP's snapshots: ``where`` per parameter (snapshot number,
    position), None for one no snapshot covers (not reduced by DDP)."""

    pendings: list
    where: list
    before_step: Optional[fingerprints.Pending] = None  # the same sample of the gradients, taken before the step

    def compare(self, resolved: list[list], before_step: list) -> tuple[int, list]:
        """(how many gradients changed between DDP's all-reduce and the step, their sampled
        fingerprints as the all-reduce left them), from the snapshots' ``resolved`` values and the
        sampled fingerprints ``before_step``; an uncovered gradient counts as unchanged, with its
        value before the step."""
        reduced, changed = [], 0
        for i, w in enumerate(self.where):
            now = before_step[i] if i < len(before_step) else None
            value = resolved[w[0]][w[1]] if w is not None else now
            if value != now:
                changed += 1
            reduced.append(value)
        return changed, reduced


def stepped(ddp_indices: list[int], next_sampled: bool) -> None:
    """An optimizer owning these DDP modules stepped: their snapshots are spent."""
    for index in ddp_indices:
        OWNED.add(index)
        OWNER_STEPS[index] = OWNER_STEPS.get(index, 0) + 1
        SNAPSHOTS.pop(index, None)
        NEXT_SAMPLED[index] = next_sampled
