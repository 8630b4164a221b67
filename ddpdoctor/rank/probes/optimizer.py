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

Every step also compares the param groups' values with the previous step's (a write names its
line, :mod:`ddpdoctor.rank.probes.config`). Sampled steps carry a digest of what must agree across
ranks (``Step.config``, the detail in a ``ConfigState`` when it changes), how many gradients
changed since DDP's all-reduce left them (``Step.touched``: the sampled fingerprints
:mod:`ddpdoctor.rank.probes.wrapping` took then, in ``Step.reduced``, against the same sample before
the step), and the parameters written outside the optimizer since its previous step
(``Step.written``). Gradients and parameters are each read in full once per sampled step.
"""

from __future__ import annotations

import gc
import struct
import sys
import time
import weakref
from typing import Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpdoctor.rank import bounds, callsite, update_size
from ddpdoctor.rank import fingerprint as fingerprints
from ddpdoctor.rank import fused_word_sums
from ddpdoctor.rank.clock import Phase
from ddpdoctor.rank.probes import config as config_probe
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes import loss as loss_probe
from ddpdoctor.rank.probes import sharding as sharding_probe
from ddpdoctor.rank.probes import wrapping
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.probes.sidetable import SideTable
from ddpdoctor.rank.recorder import Recorder, StepTiming
from ddpdoctor.rank.torch_modes import outside_torch_modes
from ddpdoctor.schema.events import ConfigState, OptimizerInfo, ReplacedParams, Step, UnchangedWeights
from ddpdoctor.schema.fingerprints import encode_fingerprints
from ddpdoctor.schema.probes import FUSED_FINGERPRINT_KERNEL
from ddpdoctor.schema.sampling import explains, should_fingerprint

PROBE = "optimizer"
LOADED_AT: SideTable[list] = SideTable()  # optimizer -> the user's line that restored its state before its first step
EXAMINE_UNCHANGED = 8  # measurements of one unchanged weight per run: enough for the check's 5-step streak


class _OptimizerState:
    def __init__(self, index: int, owned_ddp: set[int]) -> None:
        self.index = index
        self.num_steps = 0
        self.owned_ddp = owned_ddp
        self.last_forwards: dict[int, tuple[int, int, int]] = {}
        self.pending_grads: Optional[fingerprints.Pending] = None
        self.sampled = False
        self.closure = False
        self.structure: tuple = ()  # parameters per group, as last described
        self.watch: Optional[config_probe.ParamGroupsWatch] = None
        self.config: Optional[tuple] = None  # (digest function's inputs) captured before a sampled step
        self.last_digest: Optional[str] = None
        self.reduced: Optional[wrapping.Reduced] = None
        self.scale: Optional[fingerprints.Pending] = None
        self.versions: Optional[list[int]] = None  # parameters' version counters after a step before a sampled one
        self.written: Optional[fingerprints.Pending] = None
        self.last_param_values: Optional[list] = None  # the parameters' fingerprints after the last sampled step
        self.examined: dict[int, int] = {}  # position -> times an unchanged weight was measured (UnchangedWeights)

    def forwards_since_last_step(self) -> dict[str, dict[str, int]]:
        out = {}
        for index in sorted(self.owned_ddp):
            if index >= len(ddp_probe.STATES):
                continue
            now = ddp_probe.STATES[index].forward_counts()
            before = self.last_forwards.get(index, (0, 0, 0))
            self.last_forwards[index] = now
            out[str(index)] = {"synced": now[0] - before[0], "unsynced": now[1] - before[1],
                               "inner": now[2] - before[2]}
        return out


def params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, group after group."""
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
        rec.host_copies.poll()  # the previous steps' fingerprints, if the device has delivered them
        state = states.get(optimizer)
        if state is None:
            state = states[optimizer] = _new_state(rec, len(states), optimizer)
        state.num_steps += 1
        rec.timing.optimizer = time.time()
        rec.set_activity("optimizer.step")
        state.closure = bool(args and callable(args[0])) or callable(kwargs.get("closure"))
        state.sampled = should_fingerprint(state.num_steps, rec.fingerprint_every)
        state.pending_grads = state.reduced = state.scale = state.config = None
        with rec.guard(PROBE, "param_groups"):
            _watch_param_groups(rec, state, optimizer)
        if state.sampled:
            with rec.guard(PROBE, "config"):
                _capture_config(state, optimizer)
        state.written = None
        if state.sampled and not state.closure:
            params = params_of(optimizer)
            if explains(state.num_steps, rec.fingerprint_every):  # the all-reduce snapshot was taken
                with rec.guard(PROBE, "reduced gradients"):
                    state.reduced = wrapping.reduced_for(params, sorted(state.owned_ddp))
            # One pass over the gradients: their full fingerprints and, to compare with the snapshot
            # DDP's all-reduce left, the same sample of them.
            state.pending_grads = fingerprints.start([p.grad for p in params], also_sampled=state.reduced is not None)
            if state.reduced is not None:
                state.reduced.before_step = state.pending_grads.sample
            with rec.guard(PROBE, "written parameters"):
                state.written = _written_since_last_step(state, params)
        state.versions = None

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
        rec.stamp(step)
        fingerprinted = False
        if state.sampled:
            with rec.guard(PROBE, "fingerprint"):  # a failed fingerprint still leaves the step counted
                fingerprinted = _fingerprint_step(rec, state, optimizer, step)
            failed_kernel = fused_word_sums.launch_failure()
            if failed_kernel is not None:  # the fingerprints are whole (the per-tensor kernels'): no check lacks them
                rec.probe_failed(FUSED_FINGERPRINT_KERNEL, failed_kernel, target="the per-tensor kernels took over")
        if not fingerprinted:  # in order behind the steps whose fingerprints are on their way
            rec.host_copies.later([], lambda _: rec.emit_stamped(step))
        state.pending_grads = state.reduced = state.scale = state.config = state.written = None
        if should_fingerprint(state.num_steps + 1, rec.fingerprint_every):
            state.versions = [p._version for p in params_of(optimizer)]  # what writes the parameters before it
        next_explained = explains(state.num_steps + 1, rec.fingerprint_every)
        with rec.guard(PROBE, "reduced gradients"):
            wrapping.stepped(sorted(state.owned_ddp), next_explained)
        if state.index == 0:  # the first optimizer's steps delimit the windows whose losses are weighed
            with rec.guard(loss_probe.PROBE, "window"):
                loss_probe.close_window(rec, state.num_steps, next_explained)
        rec.set_activity("training")

    def pre_hook(optimizer, args, kwargs):
        with rec.guard(PROBE, "step"), outside_torch_modes():
            rec.clock.enter(Phase())  # the backward's all-reduces are booked to it; the step is not DDP's
            before_step(optimizer, args, kwargs)

    def post_hook(optimizer, args, kwargs):
        with rec.guard(PROBE, "step"), outside_torch_modes():
            after_step(optimizer)
        bounds.after_step(rec)  # --max-steps: raises RunCut into the script at this step boundary

    handles = [register_optimizer_step_pre_hook(pre_hook), register_optimizer_step_post_hook(post_hook)]
    rec.on_dump.append(lambda: rec.host_copies.flush(wait_s=1.0))  # a hang: the steps before it, in the evidence

    def wrap_load_state_dict(original):
        def load_state_dict(self, state_dict):
            result = original(self, state_dict)
            with rec.guard(PROBE, "Optimizer.load_state_dict"):
                site = callsite.user_frames(sys._getframe(1), 2)
                if site and states.get(self) is None:  # restored before its first step: a resume
                    LOADED_AT.set(self, site)
            return result

        return load_state_dict

    patch(rec, PROBE, torch.optim.Optimizer, "load_state_dict", wrap_load_state_dict)

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _new_state(rec: Recorder, index: int, optimizer: torch.optim.Optimizer) -> _OptimizerState:
    """Describe an optimizer at its first step: parameter names (DDP's, else found once among live
    modules) and which DDP module owns each."""
    state = _OptimizerState(index, set())
    _describe(rec, state, optimizer, site=callsite.caller_site(2))
    with rec.guard(PROBE, "param_groups"):
        state.watch = config_probe.ParamGroupsWatch(optimizer)
    return state


def _describe(rec: Recorder, state: _OptimizerState, optimizer: torch.optim.Optimizer, *, site: list) -> None:
    params = params_of(optimizer)
    names = [ddp_probe.PARAM_NAMES.get(id(p)) for p in params]
    ddp_of = [ddp_probe.PARAM_DDP.get(id(p)) for p in params]
    in_ddp = [n is not None for n in names]
    frozen = [ddp_probe.FROZEN_AT_WRAP.get(id(p)) if not inside else None for p, inside in zip(params, in_ddp)]
    names = [n if n is not None or f is None else f[1] for n, f in zip(names, frozen)]
    if not all(n is not None for n in names):
        fallback = _names_from_live_modules({id(p) for p, n in zip(params, names) if n is None})
        names = [n if n is not None else fallback.get(id(p), f"param{i}")
                 for i, (n, p) in enumerate(zip(names, params))]
    state.structure = tuple(len(g["params"]) for g in optimizer.param_groups)
    state.owned_ddp = {d for d in ddp_of if d is not None}
    entries, step = _state_summary(optimizer) if state.num_steps <= 1 else (0, None)
    rec.emit(OptimizerInfo(opt=state.index, type_name=type(optimizer).__name__, names=names, in_ddp=in_ddp,
                           ddp_of=ddp_of, shapes=[list(p.shape) for p in params], site=site,
                           built_at=config_probe.built_site(optimizer), n=max(1, state.num_steps),
                           group_sizes=list(state.structure), dtypes=[str(p.dtype) for p in params],
                           frozen_in=[f[0] if f is not None else None for f in frozen] if any(frozen) else [],
                           loaded_at=LOADED_AT.get(optimizer) or [], state_entries=entries, state_step=step))
    with rec.guard(PROBE, "replaced parameters"):
        _replaced(rec, state, params)


def _replaced(rec: Recorder, state: _OptimizerState, params: list[torch.Tensor]) -> None:
    """The tensors of this optimizer that ``fully_shard`` replaced after it took them (one lookup by
    identity per parameter; the model's names for their replacements only when there are some)."""
    found = [(i, r) for i, r in enumerate(sharding_probe.REPLACED.get(p) for p in params) if r is not None]
    if not found:
        return
    news = {i: r.new() if r.new is not None else None for i, r in found}
    named = _names_from_live_modules({id(p) for p in news.values() if p is not None})
    sites: list[list] = []
    for _, r in found:
        if r.site not in sites:
            sites.append(r.site)
    rec.emit(ReplacedParams(opt=state.index, n=max(1, state.num_steps), api=found[0][1].api,
                            positions=[i for i, _ in found],
                            names=[named.get(id(news[i]), r.name) if news[i] is not None else r.name for i, r in found],
                            shapes=[r.shape for _, r in found], sites=sites))


def _state_summary(optimizer: torch.optim.Optimizer) -> tuple[int, Optional[float]]:
    """(parameters with state, the largest step count in it) before the optimizer's first step: what a
    resume restored. Read once per optimizer (a step counter on a GPU costs one small copy)."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict) or not state:
        return 0, None
    steps = [entry.get("step") for entry in state.values() if isinstance(entry, dict) and "step" in entry]
    values = [float(s.item()) if isinstance(s, torch.Tensor) else float(s) for s in steps
              if isinstance(s, (int, float, torch.Tensor)) and (not isinstance(s, torch.Tensor) or s.numel() == 1)]
    return len(state), (max(values) if values else None)


def _watch_param_groups(rec: Recorder, state: _OptimizerState, optimizer: torch.optim.Optimizer) -> None:
    """Before every step: a param group added since the previous one (described again), a value
    written (its writer recorded once)."""
    if tuple(len(g["params"]) for g in optimizer.param_groups) != state.structure:
        _describe(rec, state, optimizer, site=callsite.caller_site(2))
    if state.watch is not None:
        write = state.watch.check(optimizer, state.index, state.num_steps)
        if write is not None:
            rec.emit(write)


def _capture_config(state: _OptimizerState, optimizer: torch.optim.Optimizer) -> None:
    """Before a sampled step, what the digest covers (the values this step uses); a GradScaler's
    scale is read with the fingerprints, in the same host copy."""
    scaler = _grad_scaler()
    scale = getattr(scaler, "_scale", None) if scaler is not None and scaler.is_enabled() else None
    if isinstance(scale, torch.Tensor):
        # As float64: its fingerprint, a word sum of one 8-byte word, is then the value's bits.
        state.scale = fingerprints.start([scale.detach().reshape(1)[:1].to(torch.float64)])
    state.config = config_probe.capture(optimizer, sorted(state.owned_ddp), None)


def _fingerprint_step(rec: Recorder, state: _OptimizerState, optimizer: torch.optim.Optimizer, step: Step) -> bool:
    """Launch a sampled step's fingerprints; once their values reach the host (one copy for
    everything, behind the device: rank/host_copies.py), fill them and the config digest into
    ``step`` and write it. False when nothing was launched (the caller writes the step)."""
    params = params_of(optimizer)
    grads = state.pending_grads
    if state.closure:
        grads = fingerprints.start([p.grad for p in params])
    if grads is None:
        return False
    reduced, scale, written, config = state.reduced, state.scale, state.written, state.config
    extra = [*([reduced.before_step, *reduced.pendings] if reduced is not None else []),
             *([scale] if scale is not None else []), *([written] if written is not None else [])]
    pending = [grads, fingerprints.start(params), *extra]

    def arrived(host: Optional[list[list]]) -> None:
        try:
            if host is not None:
                _fill_step(rec, state, optimizer, step, fingerprints.assign(pending, host),
                           reduced=reduced, scale=scale, written=written, config=config)
        except Exception as exc:
            rec.probe_failed(PROBE, exc, target="fingerprint")
        rec.emit_stamped(step)

    rec.host_copies.later(fingerprints.gather(*pending), arrived)
    return True


def _fill_step(rec: Recorder, state: _OptimizerState, optimizer: torch.optim.Optimizer, step: Step,
               resolved: list[list], *, reduced: Optional[wrapping.Reduced], scale: Optional[fingerprints.Pending],
               written: Optional[fingerprints.Pending], config: Optional[tuple]) -> None:
    """A sampled step's fingerprints and config digest, from their host values (``resolved``: the
    gradients, the parameters, then the extras in the order _fingerprint_step launched them)."""
    grad_values, param_values = resolved.pop(0), resolved.pop(0)
    if written is not None:
        step.written = encode_fingerprints(resolved.pop())
    scale_value = _float_of_bits(resolved.pop()[0][0]) if scale is not None else None
    if reduced is not None:
        sampled_values = resolved.pop(0)
        step.touched, as_reduced = reduced.compare(resolved, sampled_values)
        step.reduced = encode_fingerprints(as_reduced)
    step.grads, step.params = encode_fingerprints(grad_values), encode_fingerprints(param_values)
    with rec.guard(PROBE, "unchanged weights"):
        _measure_unchanged(rec, state, optimizer, step, grad_values, param_values)
    state.last_param_values = param_values
    if config is not None:
        digest, detail = config
        if scale_value is not None:
            digest = f"{digest}:{scale_value!r}"
        step.config = digest
        if digest != state.last_digest:
            state.last_digest = digest
            rec.emit_stamped(rec.stamp(ConfigState(opt=state.index, n=step.n, digest=digest,
                                                   **{**detail(), "scale": scale_value}), like=step))


def _measure_unchanged(rec: Recorder, state: _OptimizerState, optimizer: torch.optim.Optimizer, step: Step,
                       grad_values: list, param_values: list) -> None:
    """Parameters this step left bit-for-bit unchanged despite a non-zero gradient: how their update
    compares with their dtype's spacing (rank/update_size.py), a few times per parameter and run.
    On a GPU this runs when the step's fingerprints have arrived, up to a few steps later: the
    optimizer's state is read then, an update size of nearly the same step."""
    previous = state.last_param_values
    if previous is None or len(previous) != len(param_values):
        return
    positions = [i for i, (grad, now, before) in enumerate(zip(grad_values, param_values, previous))
                 if grad is not None and grad[0] and now is not None and now == before
                 and state.examined.get(i, 0) < EXAMINE_UNCHANGED]
    if not positions:
        return
    for i in positions:
        state.examined[i] = state.examined.get(i, 0) + 1
    params, median = update_size.examine(optimizer, positions)
    rec.emit_stamped(rec.stamp(UnchangedWeights(opt=state.index, n=step.n, params=params, grad_rms_median=median),
                               like=step))


def _float_of_bits(word: int) -> float:
    return struct.unpack("<d", struct.pack("<q", word))[0]


def _written_since_last_step(state: _OptimizerState, params: list) -> Optional[fingerprints.Pending]:
    """Fingerprints of the parameters written outside the optimizer since its previous step (None
    when none was, the common case: one version-counter read per parameter)."""
    if state.versions is None or len(state.versions) != len(params):
        return None
    written = [p if p._version != v else None for p, v in zip(params, state.versions)]
    return fingerprints.start(written) if any(w is not None for w in written) else None


def _grad_scaler() -> Optional[torch.amp.GradScaler]:
    """The GradScaler whose ``step()`` is stepping this optimizer, found on the stack."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(candidate, torch.amp.GradScaler):
            return candidate
        frame = frame.f_back
    return None


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
