"""Probes on every optimizer step through torch's global step hooks (no patching).

Before the step: fingerprints of the gradients. After: fingerprints of the parameters, and how many
training forwards each DDP module owning this optimizer's parameters ran since its previous step.
Sampled by :mod:`ddpdoctor.schema.sampling`.

Two patterns real code uses shape this probe:
- an optimizer that wraps a per-rank inner optimizer (ZeroRedundancyOptimizer, framework
  wrappers) steps the inner one inside its own step: only the outermost step is recorded, since
  its parameters are what must be equal across ranks;
- ``optimizer.step(closure)`` (LBFGS, Lightning) runs backward inside the step, after the pre-step
  hook: gradients are read after the step then, when they are final.
"""

from __future__ import annotations

import gc
import sys
import time
import weakref
from typing import Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpdoctor.rank import bounds, callsite
from ddpdoctor.rank import fingerprint as fingerprints
from ddpdoctor.rank.clock import Phase
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.recorder import Recorder, StepTiming
from ddpdoctor.schema.events import OptimizerInfo, Step
from ddpdoctor.schema.fingerprints import encode_fingerprints
from ddpdoctor.schema.sampling import should_fingerprint

PROBE = "optimizer"


class _OptimizerState:
    def __init__(self, index: int, owned_ddp: set[int]) -> None:
        self.index = index
        self.num_steps = 0
        self.owned_ddp = owned_ddp
        self.last_forwards: dict[int, tuple[int, int, int]] = {}
        self.pending_grads: Optional[fingerprints.Pending] = None
        self.sampled = False
        self.closure = False

    def forwards_since_last_step(self) -> dict[str, dict[str, int]]:
        out = {}
        for index in sorted(self.owned_ddp):
            if index >= len(ddp_probe.STATES):
                continue
            now = ddp_probe.STATES[index].forward_counts()
            before = self.last_forwards.get(index, (0, 0, 0))
            self.last_forwards[index] = now
            out[str(index)] = {"synced": now[0] - before[0], "unsynced": now[1] - before[1], "inner": now[2] - before[2]}
        return out


def _params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _inside_step_of(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a frame of the current stack is a method of ``optimizer`` (its step is running)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_locals.get("self") is optimizer:
            return True
        frame = frame.f_back
    return False


def install(rec: Recorder) -> Callable[[], None]:
    states: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _OptimizerState]" = weakref.WeakKeyDictionary()
    outer: list[torch.optim.Optimizer] = []  # the optimizer whose step is running, if any

    def is_nested(optimizer) -> bool:
        if not outer or outer[-1] is optimizer:
            return False
        if _inside_step_of(outer[-1]):
            return True
        outer.clear()  # the outer step raised before its post-hook: forget it
        return False

    def before_step(optimizer, args, kwargs) -> None:
        if is_nested(optimizer):
            return
        outer[:] = [optimizer]
        state = states.get(optimizer)
        if state is None:
            state = states[optimizer] = _new_state(rec, len(states), optimizer)
        state.num_steps += 1
        rec.timing.optimizer = time.time()
        rec.set_activity("optimizer.step")
        state.closure = bool(args and callable(args[0])) or callable(kwargs.get("closure"))
        state.sampled = should_fingerprint(state.num_steps, rec.fingerprint_every)
        state.pending_grads = None
        if state.sampled and not state.closure:
            state.pending_grads = fingerprints.start([p.grad for p in _params_of(optimizer)])

    def after_step(optimizer) -> None:
        if not outer or outer[-1] is not optimizer:
            return  # an inner optimizer's step, or one whose pre-hook did not run
        outer.clear()
        state = states.get(optimizer)
        if state is None:
            return
        rec.num_steps += 1
        step = Step(opt=state.index, n=state.num_steps, forwards=state.forwards_since_last_step(),
                    closure=state.closure, timing=rec.timing.encode(time.time()))
        rec.timing = StepTiming()
        if state.sampled:
            with rec.guard(PROBE, "fingerprint"):  # a failed fingerprint still leaves the step counted
                params = _params_of(optimizer)
                grads = state.pending_grads if not state.closure else fingerprints.start([p.grad for p in params])
                if grads is not None:  # one host copy for the gradients and the parameters together
                    grad_values, param_values = fingerprints.resolve(grads, fingerprints.start(params))
                    step.grads, step.params = encode_fingerprints(grad_values), encode_fingerprints(param_values)
        rec.emit(step)
        state.pending_grads = None
        rec.set_activity("training")

    def pre_hook(optimizer, args, kwargs):
        with rec.guard(PROBE, "step"):
            rec.clock.enter(Phase())  # the backward's all-reduces are booked to it; the step is not DDP's
            before_step(optimizer, args, kwargs)

    def post_hook(optimizer, args, kwargs):
        with rec.guard(PROBE, "step"):
            after_step(optimizer)
        bounds.after_step(rec)  # --max-steps: raises RunCut into the script at this step boundary

    handles = [register_optimizer_step_pre_hook(pre_hook), register_optimizer_step_post_hook(post_hook)]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _new_state(rec: Recorder, index: int, optimizer: torch.optim.Optimizer) -> _OptimizerState:
    """Describe an optimizer at its first step: parameter names (DDP's, else found once among live
    modules) and which DDP module owns each."""
    params = _params_of(optimizer)
    names = [ddp_probe.PARAM_NAMES.get(id(p)) for p in params]
    ddp_of = [ddp_probe.PARAM_DDP.get(id(p)) for p in params]
    in_ddp = [n is not None for n in names]
    if not all(in_ddp):
        fallback = _names_from_live_modules({id(p) for p, ok in zip(params, in_ddp) if not ok})
        names = [n if n is not None else fallback.get(id(p), f"param{i}") for i, (n, p) in enumerate(zip(names, params))]
    rec.emit(OptimizerInfo(opt=index, type_name=type(optimizer).__name__, names=names, in_ddp=in_ddp, ddp_of=ddp_of,
                           shapes=[list(p.shape) for p in params], site=callsite.caller_site(2)))
    return _OptimizerState(index, {d for d in ddp_of if d is not None})


def _names_from_live_modules(wanted: set[int]) -> dict[int, str]:
    best: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__ on a mismatch, and some objects warn
        # on any attribute access (torch.distributed.reduce_op's FutureWarning in the script's output).
        if not issubclass(type(obj), torch.nn.Module):
            continue
        named = list(obj.named_parameters())
        for name, p in named:
            if id(p) in wanted and len(named) > best.get(id(p), (-1, ""))[0]:
                best[id(p)] = (len(named), name)
    return {k: v[1] for k, v in best.items()}
