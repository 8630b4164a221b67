"""Probes on DistributedDataParallel: forwards (synced, under no_sync, bypassed), which parameters
got a gradient in each synchronized iteration, and buffer fingerprints after DDP's broadcast.

Gradient arrival is attributed per DDP module and per iteration, as DDP itself does: an iteration
runs from a synchronized training forward to the next forward of the same module. Optimizer steps
play no part, so two models stepped by two optimizers (a GAN, actor-critic) are judged each on
its own backward passes.
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.rank import callsite, frameworks
from ddpdoctor.rank.clock import Phase
from ddpdoctor.rank.fingerprint import fingerprint
from ddpdoctor.rank.gc_pause import gc_paused
from ddpdoctor.rank.probes import loss as loss_probe
from ddpdoctor.rank.probes import module_calls
from ddpdoctor.rank.probes import sharding as sharding_probe
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.probes.sidetable import SideTable
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.torch_modes import outside_torch_modes
from ddpdoctor.schema.events import BufferFingerprint, DDPUsage, DDPWrap, InternalPhase
from ddpdoctor.schema.sampling import should_fingerprint

PROBE = "ddp"


@dataclass
class DDPState:
    """Counters of one DDP wrapper, cumulative over the run."""

    index: int
    names: list[str]
    buffer_names: list[str]
    buffers: list[torch.Tensor]
    synced_forwards: int = 0
    unsynced_forwards: int = 0
    inner_forwards: int = 0
    buffer_forwards: int = 0  # training forwards of the wrapped module with sync on (DDP bypassed or not)
    fired: set = field(default_factory=set)  # parameter indices with a gradient in the open iteration
    iteration_open: bool = False
    iterations: int = 0
    unused_counts: dict[int, int] = field(default_factory=dict)
    last_emitted_unused: Optional[frozenset] = None
    usage_dirty: bool = False
    last_forward_site: list = field(default_factory=list)  # the user's line of the last DDP forward
    expected_grads: int = 0  # parameters that got a gradient in the last closed iteration (0: all)
    arrived: int = 0  # gradients that arrived since the last training forward

    def forward_counts(self) -> tuple[int, int, int]:
        return self.synced_forwards, self.unsynced_forwards, self.inner_forwards

    def close_iteration(self, rec: Recorder) -> None:
        """End the open synchronized iteration; written at once when it left parameters without a
        gradient (DDP may raise about them at the very next forward)."""
        if not self.iteration_open:
            return
        self.iteration_open = False
        if not self.fired:  # no backward ran: DDP does not mind either
            return
        unused = frozenset(range(len(self.names))) - self.fired
        self.expected_grads = len(self.fired)
        self.fired.clear()  # cleared in place: the gradient hooks hold this very set
        self.iterations += 1
        for i in unused:
            self.unused_counts[i] = self.unused_counts.get(i, 0) + 1
        self.usage_dirty = True
        if unused and unused != self.last_emitted_unused:
            self.emit_usage(rec, last_unused=sorted(unused))
            self.last_emitted_unused = unused

    def emit_usage(self, rec: Recorder, *, last_unused: list[int] = (), final: bool = False) -> None:
        backwards = self.iterations + (1 if self.iteration_open and self.fired else 0)
        rec.emit(DDPUsage(ddp=self.index, iterations=self.iterations, backwards=backwards,
                          last_unused=list(last_unused), final=final,
                          unused={str(i): c for i, c in sorted(self.unused_counts.items())}))
        self.usage_dirty = False


STATES: list[DDPState] = []
STATE_OF: SideTable[DDPState] = SideTable()  # DDP wrapper -> its state (nothing is kept on the wrapper itself)
# Called with (ddp module, its DDPState) when a DDP module is wrapped.
ATTACH_LISTENERS: list[Callable[[DistributedDataParallel, DDPState], None]] = []
# Around every forward of a DDP wrapper the probes know, in order: before(ddp, state, inputs, kwargs)
# at its start, after(ddp, state, output) at its end (output None when the forward raised). Listeners
# guard themselves. DDP's class is patched, no hook is registered on the instance: the module the
# user pickles, copies or scripts is exactly the one they built.
BEFORE_FORWARD: list[Callable[[DistributedDataParallel, DDPState, tuple, dict], None]] = []
AFTER_FORWARD: list[Callable[[DistributedDataParallel, DDPState, Any], None]] = []
PARAM_NAMES: dict[int, str] = {}  # id(parameter) -> name inside its DDP module
PARAM_DDP: dict[int, int] = {}  # id(parameter) -> index of its DDP module
# id(parameter) -> (DDP index, name): in a wrapped module, but frozen when DDP was built, so not DDP's
FROZEN_AT_WRAP: dict[int, tuple[int, str]] = {}


def total_synced_forwards() -> int:
    """Synchronized training forwards through any DDP module so far (a loader pass that saw none
    does not feed DDP training)."""
    return sum(s.synced_forwards for s in STATES)


def _import_dynamo_quietly() -> None:
    """Import torch._dynamo, which DDP's constructor is about to import anyway, with the collector
    paused (:mod:`ddpdoctor.rank.gc_pause`), then run one full collection, which moves what survived
    it to the collector's old generation. Left in the young generation, its 200,000 objects were
    scanned by the first collections after it instead: one of them, in the training loop, took
    65 ms (2% of a 40-step job's mean step); unpaused, each young collection of the import scans
    them again. A full collection, not only of the young generations, because the collector
    decides when to run the next full one from the size the last full one found: with none since
    torch's paused import, that size was stale, and the training loop ran one (55 ms, at step 117
    of a GPT with every step fingerprinted). Here it costs what collecting the young generations
    did: the old one holds little but what torch's import froze, which no collection scans. An
    import that fails is left for the constructor to raise, as it would without ddpdoctor."""
    if "torch._dynamo" in sys.modules:
        return
    with gc_paused():
        try:
            importlib.import_module("torch._dynamo")
        except Exception:
            pass
    if gc.isenabled():  # a script that turned the collector off gets no collection from ddpdoctor
        gc.collect()


def install(rec: Recorder) -> Callable[[], None]:
    def wrap_init(original):
        def __init__(self, module, *args, **kwargs):
            _import_dynamo_quietly()
            with rec.guard(PROBE, "DistributedDataParallel.__init__"):  # its broadcasts are DDP's own collectives
                rec.clock.enter(Phase(InternalPhase.DDP_INIT, ddp=len(STATES), site=callsite.caller_site(3)))
            try:
                original(self, module, *args, **kwargs)
            finally:
                with rec.guard(PROBE, "DistributedDataParallel.__init__"):
                    rec.clock.enter(Phase())
            with rec.guard(PROBE, "DistributedDataParallel.__init__"):
                _attach(rec, self)

        return __init__

    patch(rec, PROBE, DistributedDataParallel, "__init__", wrap_init)
    patch(rec, PROBE, DistributedDataParallel, "forward", _wrap_forward)
    BEFORE_FORWARD.insert(0, functools.partial(_on_ddp_forward, rec))  # first: the others read its call site
    AFTER_FORWARD.insert(0, functools.partial(_on_ddp_forward_done, rec))

    def flush(final: bool) -> None:
        for state in STATES:
            if final:
                state.close_iteration(rec)
            running = state.iteration_open and bool(state.fired)  # a backward under way (a hang in it)
            if (state.iterations or running) and (state.usage_dirty or final or running):
                state.emit_usage(rec, final=final)

    def finish() -> None:
        flush(final=True)
        module_calls.unwatch_all()

    rec.on_dump.append(lambda: flush(final=False))
    return finish


def _wrap_forward(original: Callable) -> Callable:
    def forward(self: DistributedDataParallel, *inputs: Any, **kwargs: Any) -> Any:
        state = STATE_OF.get(self)
        if state is None or module_calls.traced():  # built before the probes, or traced by a compiler
            return original(self, *inputs, **kwargs)
        with outside_torch_modes():
            for before in BEFORE_FORWARD:
                before(self, state, inputs, kwargs)
        output = None
        try:
            output = original(self, *inputs, **kwargs)
            return output
        finally:
            with outside_torch_modes():
                for after in AFTER_FORWARD:
                    after(self, state, output)

    module_calls.skip_in_dynamo(forward)
    return forward


def _on_ddp_forward(rec: Recorder, module: DistributedDataParallel, state: DDPState, inputs: tuple,
                    kwargs: dict) -> None:
    rec.progress += 1
    grad = torch.is_grad_enabled()
    with rec.guard(PROBE, "forward"):  # what DDP's forward broadcasts is booked to this line
        state.last_forward_site = callsite.caller_site(1)
        rec.clock.enter(Phase(InternalPhase.DDP_FORWARD, ddp=state.index,
                              grad=grad and module.require_backward_grad_sync, training=module.training,
                              site=state.last_forward_site))
    if not grad:  # evaluation forwards never reduce gradients
        return
    if rec.timing.forward is None:
        rec.timing.forward = time.time()
    rec.gradients_complete = False
    state.arrived = 0
    with rec.guard(PROBE, "forward"):
        state.close_iteration(rec)
        if module.require_backward_grad_sync:
            state.synced_forwards += 1
            state.iteration_open = True
        else:
            state.unsynced_forwards += 1


def _on_ddp_forward_done(rec: Recorder, module: DistributedDataParallel, state: DDPState, output: Any) -> None:
    with rec.guard(PROBE, "forward"):
        rec.clock.enter(Phase())


def _attach(rec: Recorder, ddp: DistributedDataParallel) -> None:
    framework, framework_version = frameworks.framework_of(sys._getframe(1))
    named = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
    named_buffers = list(ddp.module.named_buffers())
    state = DDPState(index=len(STATES), names=[n for n, _ in named], buffer_names=[n for n, _ in named_buffers],
                     buffers=[b for _, b in named_buffers])
    STATES.append(state)
    for i, (name, p) in enumerate(named):
        PARAM_NAMES[id(p)] = name if state.index == 0 else f"ddp{state.index}:{name}"
        PARAM_DDP[id(p)] = state.index
        FROZEN_AT_WRAP.pop(id(p), None)
        p.register_post_accumulate_grad_hook(functools.partial(_grad_arrived, rec, state, i))
    frozen = [(n, p) for n, p in ddp.module.named_parameters() if not p.requires_grad]
    for name, p in frozen:
        if id(p) not in PARAM_DDP:
            FROZEN_AT_WRAP[id(p)] = (state.index, name if state.index == 0 else f"ddp{state.index}:{name}")

    wrapper = weakref.ref(ddp)  # the watch must not keep the wrapper alive: the script decides when it goes

    def on_inner_forward(module, inputs, kwargs):
        if not torch.is_grad_enabled():
            return
        state.inner_forwards += 1
        ddp = wrapper()
        if ddp is None or not (ddp.training and ddp.require_backward_grad_sync):
            return
        state.buffer_forwards += 1
        if state.buffers and should_fingerprint(state.buffer_forwards, rec.fingerprint_every):
            with rec.guard(PROBE, "buffers"):
                rec.emit(BufferFingerprint(ddp=state.index, forward=state.buffer_forwards,
                                           fp=fingerprint(state.buffers)))

    STATE_OF.set(ddp, state)
    for listener in ATTACH_LISTENERS:
        listener(ddp, state)
    module_calls.watch(ddp.module, on_inner_forward)
    rec.emit(DDPWrap(
        ddp=state.index, params=state.names, shapes=[list(p.shape) for _, p in named], buffers=state.buffer_names,
        find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
        static_graph=bool(getattr(ddp, "static_graph", False)),
        broadcast_buffers=bool(getattr(ddp, "broadcast_buffers", True)),
        sync_batchnorm=any(isinstance(m, torch.nn.SyncBatchNorm) for m in ddp.module.modules()),
        device=str(next((p.device for _, p in named), "cpu")), site=callsite.caller_site(3),
        framework=framework, framework_version=framework_version, frozen=[n for n, _ in frozen],
        group_ranks=sharding_probe.group_ranks(getattr(ddp, "process_group", None))))



def _grad_arrived(rec: Recorder, state: DDPState, index: int, param: torch.Tensor) -> None:
    if not state.fired and rec.clock.phase.name != InternalPhase.DDP_BACKWARD:
        # The first gradient of a backward: DDP's bucket all-reduces now belong to it. No clock read
        # here: this may be an autograd thread; the next observation on the main thread books them.
        rec.clock.phase = Phase(InternalPhase.DDP_BACKWARD, ddp=state.index, site=_backward_site(state))
    state.fired.add(index)
    rec.progress += 1
    state.arrived += 1
    if loss_probe.sampling() and loss_probe.samples(index, len(state.names)):
        # global-batch: this parameter's local gradient, before DDP averages it
        with rec.guard(loss_probe.PROBE, "local gradient"), outside_torch_modes():
            loss_probe.record_grad(state.index, index, len(state.names), param.grad)
    timing = rec.timing
    if timing.backward is None:
        timing.backward = time.time()
    if state.arrived == (state.expected_grads or len(state.names)):
        # Every parameter that got a gradient last iteration has one again: the rest of a synchronized
        # backward is DDP's gradient all-reduce (the live view says so instead of "computing").
        timing.backward_end = time.time()
        rec.gradients_complete = state.iteration_open


def _backward_site(state: DDPState) -> list:
    """The user's ``loss.backward()`` line: the innermost user frame when gradients arrive on the
    main thread (CPU); the last forward's line when autograd runs on its own threads (GPU)."""
    site = callsite.caller_site(1)
    return site or state.last_forward_site or []
