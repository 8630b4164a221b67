"""Probes on DistributedDataParallel: forwards (synced, under no_sync, bypassed), per-parameter
gradient arrival (unused parameters) and buffer fingerprints after DDP's buffer broadcast."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor import callsite
from ddpdoctor.fingerprint import fingerprint
from ddpdoctor.probes.patching import patch
from ddpdoctor.recorder import Recorder
from ddpdoctor.sampling import should_fingerprint


@dataclass
class DDPState:
    """What one DDP wrapper did since the last optimizer step."""

    index: int
    names: list[str]
    buffer_names: list[str]
    buffers: list[torch.Tensor]
    synced_forwards: int = 0
    unsynced_forwards: int = 0
    inner_forwards: int = 0
    num_synced_total: int = 0
    fired: set = field(default_factory=set)

    def take_window(self) -> dict:
        """Counters since the last optimizer step, then reset them."""
        calls = self.synced_forwards + self.unsynced_forwards
        window = {
            "synced": self.synced_forwards,
            "unsynced": self.unsynced_forwards,
            "inner": self.inner_forwards,
            "unused": sorted(set(range(len(self.names))) - self.fired) if calls else None,
        }
        self.synced_forwards = self.unsynced_forwards = self.inner_forwards = 0
        self.fired.clear()  # cleared in place: the gradient hooks hold this very set
        return window


STATES: list[DDPState] = []
PARAM_NAMES: dict[int, str] = {}  # id(parameter) -> name inside its DDP module


def install(rec: Recorder) -> None:
    def wrap_init(original):
        def __init__(self, module, *args, **kwargs):
            original(self, module, *args, **kwargs)
            try:
                _attach(rec, self)
            except Exception as exc:  # a probe must never break the user's job
                rec.emit("probe_error", probe="ddp", error=repr(exc))

        return __init__

    patch(DistributedDataParallel, "__init__", wrap_init)


def _attach(rec: Recorder, ddp: DistributedDataParallel) -> None:
    named = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
    named_buffers = list(ddp.module.named_buffers())
    state = DDPState(
        index=len(STATES),
        names=[n for n, _ in named],
        buffer_names=[n for n, _ in named_buffers],
        buffers=[b for _, b in named_buffers],
    )
    STATES.append(state)
    for name, p in named:
        PARAM_NAMES[id(p)] = name if state.index == 0 else f"ddp{state.index}:{name}"
    for i, (_, p) in enumerate(named):
        p.register_post_accumulate_grad_hook(functools.partial(_grad_arrived, state.fired, i))

    def on_ddp_forward(module, inputs):
        rec.progress += 1
        if not torch.is_grad_enabled():  # evaluation forwards never reduce gradients
            return
        if module.require_backward_grad_sync:
            state.synced_forwards += 1
        else:
            state.unsynced_forwards += 1

    def on_inner_forward(module, inputs):
        if not torch.is_grad_enabled():
            return
        state.inner_forwards += 1
        if not (ddp.training and ddp.require_backward_grad_sync):
            return
        state.num_synced_total += 1
        if state.buffers and should_fingerprint(state.num_synced_total, rec.fingerprint_every):
            rec.emit("buffers", ddp=state.index, forward=state.num_synced_total,
                     fp=fingerprint(state.buffers))

    ddp.register_forward_pre_hook(on_ddp_forward)
    ddp.module.register_forward_pre_hook(on_inner_forward)
    rec.emit(
        "ddp_wrap",
        ddp=state.index,
        params=state.names,
        shapes=[list(p.shape) for _, p in named],
        buffers=state.buffer_names,
        find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
        static_graph=bool(getattr(ddp, "static_graph", False)),
        broadcast_buffers=bool(getattr(ddp, "broadcast_buffers", True)),
        sync_batchnorm=any(isinstance(m, torch.nn.SyncBatchNorm) for m in ddp.module.modules()),
        device=str(next((p.device for _, p in named), "cpu")),
        site=callsite.caller_site(2),
    )


def _grad_arrived(fired: set, index: int, param: torch.Tensor) -> None:
    fired.add(index)
