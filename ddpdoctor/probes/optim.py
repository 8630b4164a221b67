"""Probes on every optimizer step through torch's global step hooks (no patching).

Before the step: fingerprints of the gradients. After: fingerprints of the parameters, plus what
each DDP wrapper did since the previous step. Sampled by :mod:`ddpdoctor.sampling`.
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpdoctor import callsite
from ddpdoctor.fingerprint import fingerprint
from ddpdoctor.probes import ddp as ddp_probe
from ddpdoctor.recorder import Recorder
from ddpdoctor.sampling import should_fingerprint


class _OptimizerState:
    def __init__(self, index: int) -> None:
        self.index = index
        self.num_steps = 0
        self.pending_grads = None


def install(rec: Recorder) -> list:
    states: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _OptimizerState]" = weakref.WeakKeyDictionary()

    def params_of(optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def pre_hook(optimizer, args, kwargs):
        state = states.get(optimizer)
        if state is None:
            state = states[optimizer] = _OptimizerState(len(states))
            _describe(rec, state.index, params_of(optimizer))
        state.num_steps += 1
        rec.set_activity("optimizer.step")
        if should_fingerprint(state.num_steps, rec.fingerprint_every):
            state.pending_grads = fingerprint([p.grad for p in params_of(optimizer)])
        else:
            state.pending_grads = None

    def post_hook(optimizer, args, kwargs):
        state = states.get(optimizer)
        if state is None:
            return
        rec.num_steps += 1
        windows = {s.index: s.take_window() for s in ddp_probe.STATES}
        if state.pending_grads is not None:
            rec.emit("step", opt=state.index, n=state.num_steps, grads=state.pending_grads,
                     params=fingerprint(params_of(optimizer)), ddp=windows)
        else:
            rec.emit("step", opt=state.index, n=state.num_steps, ddp=windows)
        state.pending_grads = None
        rec.set_activity("training")

    return [register_optimizer_step_pre_hook(pre_hook), register_optimizer_step_post_hook(post_hook)]


def _describe(rec: Recorder, index: int, params: list[torch.Tensor]) -> None:
    """Names for an optimizer's parameters: DDP's names, else found once among live modules."""
    names = [ddp_probe.PARAM_NAMES.get(id(p)) for p in params]
    in_ddp = [n is not None for n in names]
    if not all(in_ddp):
        fallback = _names_from_live_modules({id(p) for p, ok in zip(params, in_ddp) if not ok})
        names = [n if n is not None else fallback.get(id(p), f"param{i}") for i, (n, p) in enumerate(zip(names, params))]
    rec.emit("optimizer", opt=index, names=names, in_ddp=in_ddp, shapes=[list(p.shape) for p in params],
             site=callsite.caller_site(2))


def _names_from_live_modules(wanted: set[int]) -> dict[int, str]:
    best: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        if not isinstance(obj, torch.nn.Module):
            continue
        named = list(obj.named_parameters())
        for name, p in named:
            if id(p) in wanted and len(named) > best.get(id(p), (-1, ""))[0]:
                best[id(p)] = (len(named), name)
    return {k: v[1] for k, v in best.items()}
