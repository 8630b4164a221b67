"""Probes on what configures training, for config-sync and optimizer-params.

Recorded at the moment it happens, each at most once per call site:
- ``Module.train()``/``eval()`` calls that change a module's mode (``ModeChange``);
- where each optimizer was built (``Optimizer.__init__``), for the optimizer probe's description;
- who may write an optimizer's param groups: LR schedulers' ``step()`` calls and user code that
  reads ``optimizer.param_groups``. The optimizer probe compares the groups' values at every step
  (a few dict reads) and, when they changed, names these lines (``ParamGroupsWrite``).

Costs: ``train()`` recurses into every submodule and each nested call passes through the patch
(one attribute read); a scheduler step walks a few frames; a ``param_groups`` read from user code
one frame check. Nothing here reads tensor data or talks to other ranks.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.rank import callsite
from ddpdoctor.rank import config_state
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import ModeChange, ParamGroupsWrite

PROBE = "config"
MAX_WRITER_SITES = 4

# id(module) -> (DDP index, name inside it); the wrapper itself is "(wrapper)".
MODULES: dict[int, tuple[int, str]] = {}
DDP_MODULES: dict[int, "weakref.ref[DistributedDataParallel]"] = {}  # DDP index -> the wrapper
AUTOCAST: dict[int, tuple] = {}  # DDP index -> (enabled, dtype) at its last training forward
BUILT: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list]" = weakref.WeakKeyDictionary()


class _Writers:
    """Lines that may have written one optimizer's param groups since its previous step."""

    __slots__ = ("schedulers", "readers")

    def __init__(self) -> None:
        self.schedulers: list[dict] = []
        self.readers: list[dict] = []

    def clear(self) -> None:
        self.schedulers.clear()
        self.readers.clear()


WRITERS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _Writers]" = weakref.WeakKeyDictionary()


def _writers(optimizer: Any) -> Optional[_Writers]:
    try:
        found = WRITERS.get(optimizer)
        if found is None:
            found = WRITERS[optimizer] = _Writers()
        return found
    except TypeError:  # not weak-referenceable
        return None


def _add_site(sites: list[dict], frame) -> None:
    site = {"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}
    if site not in sites:
        if len(sites) >= MAX_WRITER_SITES:
            sites.pop(0)
        sites.append(site)


class _ParamGroups:
    """``Optimizer.param_groups`` as a data descriptor over the instance's own ``__dict__`` entry:
    a read from user code notes its line (the writer of a value the next step sees changed is
    among them). Reads from torch (every step reads it) cost one cached file-name check."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        try:
            groups = obj.__dict__["param_groups"]
        except KeyError:
            raise AttributeError("param_groups") from None
        if _compiling():
            return groups
        frame = sys._getframe(1)
        if callsite.is_user_file(frame.f_code.co_filename):
            writers = _writers(obj)
            if writers is not None:
                _add_site(writers.readers, frame)
        return groups

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["param_groups"] = value

    def __delete__(self, obj: Any) -> None:
        del obj.__dict__["param_groups"]


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except Exception:
        return False


class ParamGroupsWatch:
    """One optimizer's param-group values as of its previous step, and the writes already reported."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.last = config_state.fast_signature(optimizer)
        self.reported: set = set()
        writers = _writers(optimizer)
        if writers is not None:
            writers.clear()

    def check(self, optimizer: torch.optim.Optimizer, opt: int, n: int) -> Optional[ParamGroupsWrite]:
        """A write event when the values changed since the previous step through a writer not yet
        reported, else None. Called before every step: a handful of dict reads per group."""
        now = config_state.fast_signature(optimizer)
        if now == self.last:
            return None
        keys = config_state.changed_keys(self.last, now)
        self.last = now
        writers = _writers(optimizer)
        sites: list = []
        if writers is not None:
            sites = [{**site, "via": "scheduler"} for site in writers.schedulers]
            sites += [{**site, "via": "param_groups"} for site in writers.readers if site not in writers.schedulers]
            writers.clear()
        via = sites[0]["via"] if sites else "unknown"
        key = (tuple((s["file"], s["line"]) for s in sites), tuple(k for _, k in keys))
        if key in self.reported:
            return None
        self.reported.add(key)
        return ParamGroupsWrite(opt=opt, n=n, keys=keys, via=via, sites=sites)


def built_site(optimizer: Any) -> list:
    try:
        return BUILT.get(optimizer) or []
    except TypeError:
        return []


def install(rec: Recorder) -> Callable[[], None]:
    depth = [0]  # inside Module.train: the nested calls for the children are not the user's
    seen_modes: set = set()

    def wrap_train(original):
        def train(self, mode=True):
            if depth[0]:
                return original(self, mode)
            before = self.training
            depth[0] += 1
            try:
                return original(self, mode)
            finally:
                depth[0] -= 1
                if before != self.training:
                    with rec.guard(PROBE, "Module.train"):
                        _mode_changed(rec, seen_modes, self, sys._getframe(1))

        return train

    patch(rec, PROBE, torch.nn.Module, "train", wrap_train)

    def wrap_optimizer_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            with rec.guard(PROBE, "Optimizer.__init__"):
                if self not in BUILT:
                    BUILT[self] = callsite.user_frames(sys._getframe(1), 3)

        return __init__

    patch(rec, PROBE, torch.optim.Optimizer, "__init__", wrap_optimizer_init)

    def wrap_scheduler_step(original):
        def step(self, *args, **kwargs):
            with rec.guard(PROBE, "LRScheduler.step"):
                writers = _writers(getattr(self, "optimizer", None))
                if writers is not None:
                    frames = callsite.user_frames(sys._getframe(1), 1)
                    if frames and frames[0] not in writers.schedulers and len(writers.schedulers) < MAX_WRITER_SITES:
                        writers.schedulers.append(frames[0])
            return original(self, *args, **kwargs)

        return step

    from torch.optim import lr_scheduler

    patch(rec, PROBE, lr_scheduler.LRScheduler, "step", wrap_scheduler_step)
    if "_update_lr" in vars(lr_scheduler.LRScheduler):  # SequentialLR calls it directly at its milestones
        patch(rec, PROBE, lr_scheduler.LRScheduler, "_update_lr", wrap_scheduler_step)
    plateau = getattr(lr_scheduler, "ReduceLROnPlateau", None)
    if plateau is not None and "step" in vars(plateau):
        patch(rec, PROBE, plateau, "step", wrap_scheduler_step)

    installed_descriptor = "param_groups" not in vars(torch.optim.Optimizer)
    if installed_descriptor:
        torch.optim.Optimizer.param_groups = _ParamGroups()  # type: ignore[attr-defined]

    ddp_probe.ATTACH_LISTENERS.append(_attach)
    ddp_probe.BEFORE_FORWARD.append(_note_autocast)

    def finish() -> None:
        if _attach in ddp_probe.ATTACH_LISTENERS:
            ddp_probe.ATTACH_LISTENERS.remove(_attach)
        if _note_autocast in ddp_probe.BEFORE_FORWARD:
            ddp_probe.BEFORE_FORWARD.remove(_note_autocast)
        if installed_descriptor and isinstance(vars(torch.optim.Optimizer).get("param_groups"), _ParamGroups):
            del torch.optim.Optimizer.param_groups

    return finish


def _mode_changed(rec: Recorder, seen: set, module: torch.nn.Module, frame) -> None:
    site = callsite.user_frames(frame, 2)
    owner = MODULES.get(id(module))
    ddp, name = owner if owner is not None else (None, None)
    key = (tuple((s["file"], s["line"]) for s in site[:1]), module.training, ddp, name,
           None if owner is not None else type(module).__name__)
    if key in seen:
        return
    seen.add(key)
    rec.emit(ModeChange(ddp=ddp, name=name, type_name=type(module).__name__, training=module.training, site=site))


def _attach(ddp: DistributedDataParallel, state: "ddp_probe.DDPState") -> None:
    """Map the wrapper's modules to their names; note autocast at each of its training forwards."""
    index = state.index
    DDP_MODULES[index] = weakref.ref(ddp)
    MODULES[id(ddp)] = (index, "(wrapper)")
    for name, module in ddp.module.named_modules():
        MODULES[id(module)] = (index, name)


def _note_autocast(ddp: DistributedDataParallel, state: "ddp_probe.DDPState", inputs: tuple, kwargs: dict) -> None:
    """At each training forward of a DDP wrapper: whether autocast is on, in which dtype."""
    if torch.is_grad_enabled():
        device_type = getattr(ddp, "device_type", None) or "cpu"
        AUTOCAST[state.index] = (torch.is_autocast_enabled(device_type), str(torch.get_autocast_dtype(device_type)))


def capture(optimizer: torch.optim.Optimizer, ddp_indices: list[int],
            scale: Optional[float]) -> tuple[str, Callable[[], dict]]:
    """The digest of what must agree for this optimizer's step now, and a function that builds the
    detail (names, counts) when the caller needs it."""
    groups = config_state.group_values(optimizer, exact=True)
    parts = []
    modules = []
    for index in sorted(ddp_indices):
        ref = DDP_MODULES.get(index)
        ddp = ref() if ref is not None else None
        if ddp is None:
            continue
        modes, grads = config_state.flags(ddp)
        autocast = AUTOCAST.get(index)
        parts.append((index, modes, grads, autocast))
        modules.append((index, ddp, autocast))
    digest = config_state.digest(groups, parts, scale)

    def detail() -> dict:
        return {
            "groups": groups,
            "modules": {str(i): config_state.modes_detail(d) for i, d, _ in modules},
            "frozen": {str(i): config_state.frozen_detail(d) for i, d, _ in modules},
            "autocast": {str(i): list(a) for i, _, a in modules if a is not None},
            "scale": scale,
        }

    return digest, detail
