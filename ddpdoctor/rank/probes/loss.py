"""Probe of how each sampled step's losses are weighted (issue #33, global-batch).

DDP averages the ranks' gradients. That average is the gradient of the global batch only if every
element of the global batch weighs the same in the loss that was backpropagated. On the steps the
fingerprints sample (their accumulation window: every backward since the previous step), at the
automatic schedule's pace under ``--fingerprint-every`` (``sampling.explains``), this probe records:

- each call of ``F.cross_entropy`` / ``F.nll_loss`` (their module forms call them) made with
  gradients: its reduction and how many targets contribute (not ``ignore_index``), as a count
  tensor read once when the window closes;
- at each ``torch.autograd.backward`` (``loss.backward()`` calls it), a walk of the autograd graph
  from the root down to those calls, through the nodes that only combine or scale losses (add,
  sub, mul and div by a one-element tensor, a multiplication by a 0/1 mask, mean, sum, stack,
  casts, views): the product of the scalar factors between the root and each loss (the hand-written
  masked mean ``(loss * mask).sum() / mask.sum()`` is a factor of 1/mask.sum() on the elements it
  keeps). A mean-type node reached that is no probed call (``.mean()``, ``mse_loss``...) is recorded
  with its factor too. A GradScaler's scale is divided out.

Nothing is written on other steps; a call costs one flag test outside sampled steps. Inside a
compiled region (``torch.compiler.is_compiling()``) the wrappers call through at once, so what
TorchDynamo traces is unchanged. The window is closed by the optimizer probe's step hook
(:func:`close_window`), which emits a :class:`LossWindow`.
"""

from __future__ import annotations

import functools
import linecache
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ddpdoctor.rank import callsite
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.torch_modes import outside_torch_modes
from ddpdoctor.schema.events import LossWindow

PROBE = "loss"
LOSS_FUNCTIONS = ("cross_entropy", "nll_loss")
MAX_NODES = 256  # nodes one backward's walk visits at most
MAX_CALLS = 64  # probed calls kept per window (the rest are not weighed)
MAX_SCAN = 40  # source lines read between a loss call and its backward
GRAD_COORDINATES = 256  # local-gradient coordinates sampled per DDP module and backward, at most
MAX_PER_PARAMETER = 16
# Parameters sampled per DDP module, at most (every k-th by position, the same on every rank): each
# sample is a copy, a kernel launch on a GPU, in the backward's path; 16 of 16 coordinates give the
# 256 coordinates that 149 parameters' one each would, at a ninth of the launches (a GPT's 149).
MAX_SAMPLED_PARAMETERS = 16
# Names a script gives the world size, on a line that scales by it.
_WORLD_NAMES = re.compile(r"\b(world_size|get_world_size|WORLD_SIZE|num_processes|num_gpus|n_gpus?|ngpus"
                          r"|nprocs|num_replicas|dp_size|dp_world_size)\b")
_SCALING = re.compile(r"[*/]=?|\.div\b|\.mul\b")

# Nodes a loss passes through unchanged in value (factor 1 per input).
_PASS = frozenset({
    "ToCopyBackward0", "CloneBackward0", "ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0",
    "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "AliasBackward0",
    "ExpandBackward0", "SumBackward0", "SumBackward1", "StackBackward0", "CatBackward0", "AddBackward0",
    "SubBackward0", "NegBackward0", "MulBackward0", "DivBackward0", "MeanBackward0",
    "_DDPSinkBackward",  # DDP passes a forward's outputs through it (find_unused_parameters, static_graph)
})
# Mean-reduced loss nodes (reduction saved as 1) a backward may reach without a probed call.
_MEAN_LOSSES = {
    "MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss", "SmoothL1LossBackward0": "smooth_l1_loss",
    "HuberLossBackward0": "huber_loss", "BinaryCrossEntropyBackward0": "binary_cross_entropy",
    "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits", "NllLossBackward0": "nll_loss",
    "NllLoss2DBackward0": "nll_loss", "KlDivBackward0": "kl_div",
}


@dataclass
class _Call:
    fn: str
    reduction: str
    count: Optional[torch.Tensor]  # contributing targets, read when the window closes
    numel: int
    site: list
    factor: Optional[float] = None
    elementwise: bool = False
    reached_from: list = field(default_factory=list)  # the user's line of the backward that reached it


@dataclass
class _Window:
    sampled: bool = True  # step 1 is always fingerprinted
    calls: list = field(default_factory=list)
    nodes: dict = field(default_factory=dict)  # grad_fn node -> its _Call (the node held until the window closes)
    means: list = field(default_factory=list)
    mean_nodes: set = field(default_factory=set)  # id() of mean nodes already recorded this window
    backwards: int = 0
    scaler_nodes: dict = field(default_factory=dict)  # id(GradScaler's multiply node) -> the node
    scaled: bool = False
    backward_at: list = field(default_factory=list)
    # backward number -> (DDP index, parameter position) -> a sample of its local gradient as that
    # backward left it, before DDP's all-reduce (the ddp probe's post-accumulate hook: record_grad)
    grads: dict = field(default_factory=dict)


_WINDOW = _Window()
_depth = [0]  # inside a probed call (a loss calling another)


REDUCTION_ARG = 6  # cross_entropy's and nll_loss's positional index of ``reduction``
IGNORE_INDEX_ARG = 4


def _reduction(args: tuple, kwargs: dict) -> str:
    reduction = kwargs.get("reduction", args[REDUCTION_ARG] if len(args) > REDUCTION_ARG else "mean")
    if kwargs.get("size_average") is False or kwargs.get("reduce") is False:
        return "legacy"
    return reduction if isinstance(reduction, str) else "mean"


def _record_call(fn: str, result: Any, args: tuple, kwargs: dict) -> None:
    """Keep what a probed loss call contributes, keyed by the node its result comes out of."""
    window = _WINDOW
    if len(window.calls) >= MAX_CALLS:
        return
    node = getattr(result, "grad_fn", None)
    if node is None:
        return
    target = args[1] if len(args) > 1 else kwargs.get("target")
    ignore_index = kwargs.get("ignore_index", args[IGNORE_INDEX_ARG] if len(args) > IGNORE_INDEX_ARG else -100)
    count = None
    numel = 0
    if isinstance(target, torch.Tensor) and not target.is_floating_point():
        numel = target.numel()
        with torch.no_grad():
            count = (target != ignore_index).sum()
    call = _Call(fn=fn, reduction=_reduction(args, kwargs), count=count,
                 numel=numel, site=callsite.caller_site(1))
    window.calls.append(call)
    window.nodes[node] = call


def _scalar(tensor: Any) -> Optional[float]:
    """The value of a one-element factor; None for anything else (an elementwise weight, a mask)."""
    if isinstance(tensor, (int, float)):
        return float(tensor)
    if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
        return float(tensor.detach().reshape(()).item())
    return None


def _selects(tensor: Any) -> bool:
    """Whether an elementwise factor only selects elements (every value 0 or 1: a mask)."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_complex():
        return False
    with torch.no_grad():
        return bool(((tensor == 0) | (tensor == 1)).all())


def _walk(root: Any, site: list) -> None:
    """From a backward's root down to the probed calls and mean-type nodes: their scalar factors."""
    window = _WINDOW
    # (node, factor so far, elementwise so far, the mean node this path went through and its factor)
    stack: list[tuple[Any, float, bool, Optional[tuple[Any, float]]]] = [(root, 1.0, False, None)]
    seen = 0
    while stack and seen < MAX_NODES:
        node, factor, elementwise, mean = stack.pop()
        if node is None:
            continue
        seen += 1
        call = window.nodes.get(node)
        if call is not None:
            call.factor = factor if call.factor is None else call.factor + factor
            call.elementwise = call.elementwise or elementwise
            call.reached_from = call.reached_from or site
            continue
        name = type(node).__name__
        inputs = [n for n, _ in node.next_functions]
        if id(node) in window.scaler_nodes:  # GradScaler's scale: not the script's weighting
            window.scaled = True
            stack.append((inputs[0] if inputs else None, factor, elementwise, mean))
            continue
        if name not in _PASS or (elementwise and name in ("MulBackward0", "DivBackward0")):
            _terminal(node, name, factor, elementwise, mean, site)
            continue
        if name in ("AddBackward0", "SubBackward0"):
            alpha = float(getattr(node, "_saved_alpha", 1) or 1)
            for i, child in enumerate(inputs):
                sign = -1.0 if (name == "SubBackward0" and i == 1) else 1.0
                stack.append((child, factor * (alpha * sign if i == 1 else 1.0), elementwise, mean))
        elif name == "MulBackward0":
            for i, child in enumerate(inputs):
                if child is None:
                    continue
                other = getattr(node, "_saved_other" if i == 0 else "_saved_self", None)
                value = _scalar(other)
                if value is None and other is None:
                    continue  # a product of two losses: no constant weighting
                if value is None and _selects(other):  # a 0/1 mask keeps some elements, weighing each 1
                    stack.append((child, factor, elementwise, mean))
                    continue
                stack.append((child, factor * value if value is not None else factor, value is None, mean))
        elif name == "DivBackward0":
            value = _scalar(getattr(node, "_saved_other", None))
            if inputs and inputs[0] is not None:
                if value:
                    stack.append((inputs[0], factor / value, elementwise, mean))
                else:
                    stack.append((inputs[0], factor, True, mean))
        elif name == "NegBackward0":
            stack.append((inputs[0], -factor, elementwise, mean))
        elif name == "MeanBackward0":
            numel = int(getattr(node, "_saved_self_sym_numel", 1) or 1)
            stack.append((inputs[0], factor / numel, elementwise, (node, factor)))
        else:  # casts, views, sums, stack and cat: each input as it is
            for child in inputs:
                stack.append((child, factor, elementwise, mean))


def _terminal(node: Any, name: str, factor: float, elementwise: bool, mean: Optional[tuple[Any, float]],
              site: list) -> None:
    """A node past which the walk does not go: a mean-reduced loss, or a mean over something else."""
    window = _WINDOW
    if name in _MEAN_LOSSES and getattr(node, "_saved_reduction", None) == 1 and not elementwise:
        key = id(node)
        if key not in window.mean_nodes:
            window.mean_nodes.add(key)
            window.means.append({"node": _MEAN_LOSSES[name], "factor": factor, "site": site})
        return
    if mean is not None:
        mean_node, mean_factor = mean
        key = id(mean_node)
        if key not in window.mean_nodes:
            window.mean_nodes.add(key)
            window.means.append({"node": "mean", "factor": mean_factor, "site": site})


def sampling() -> bool:
    """Whether this step's losses are being weighed (the ddp probe then samples local gradients)."""
    return _WINDOW.sampled


def samples(position: int, parameters: int) -> bool:
    """Whether the parameter at ``position`` of ``parameters`` is one whose local gradient is
    sampled: every k-th by position, at most :data:`MAX_SAMPLED_PARAMETERS` (a cheap test the ddp
    probe makes before anything else, at every gradient of a sampled backward)."""
    return not position % _stride(parameters)


def _stride(parameters: int) -> int:
    return max(1, -(-parameters // MAX_SAMPLED_PARAMETERS))


def record_grad(ddp: int, position: int, parameters: int, grad: Optional[torch.Tensor]) -> None:
    """A sample of a parameter's local gradient right after this backward accumulated it, before
    DDP's all-reduce (its first coordinates: the same on every rank); one of ``parameters``, of which
    every k-th by position is sampled (:func:`samples`)."""
    if grad is None or not samples(position, parameters) or torch.compiler.is_compiling():
        return
    window = _WINDOW
    sampled = -(-parameters // _stride(parameters))
    k = min(max(1, min(MAX_PER_PARAMETER, GRAD_COORDINATES // max(1, sampled))), grad.numel())
    if grad.requires_grad:  # a backward with create_graph: the sample must not join its graph
        grad = grad.detach()
    if grad.device.type in _TAKE_DEVICES:
        # One op, a launch on a GPU's host: a copy of the first k coordinates in row-major order, whatever
        # the gradient's strides, in its own dtype (widened to float64 when the window joins them). A
        # view, a slice and a copy took three, 17 us on a CPU against 2.
        sample = torch.take(grad, _first_coordinates(k, grad.device))
    else:  # the same values, by ops every backend has
        sample = grad.reshape(-1)[:k].clone()
    window.grads.setdefault(window.backwards, {})[(ddp, position)] = sample


_TAKE_DEVICES = ("cpu", "cuda")  # where torch.take is a kernel of its own


@functools.lru_cache(maxsize=32)
def _first_coordinates(k: int, device: torch.device) -> torch.Tensor:
    """The indices 0..k-1 on ``device`` (a gradient sample's, made once per size and device)."""
    return torch.arange(k, device=device)


def _grad_samples(window: _Window) -> tuple[list, list[torch.Tensor]]:
    """(layout [[ddp, position, coordinates]...], per backward in order its samples in that layout
    as one tensor): empty when the backwards did not all reach the same parameters."""
    if not window.grads:
        return [], []
    keys = sorted(next(iter(window.grads.values())))
    if any(sorted(per) != keys for per in window.grads.values()):
        return [], []
    layout = [[ddp, position, int(window.grads[min(window.grads)][(ddp, position)].numel())]
              for ddp, position in keys]
    return layout, [_joined([window.grads[backward][key] for key in keys]) for backward in sorted(window.grads)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """1-d float64 tensors joined on their device (on the host when they are on several). Parts of
    one dtype are joined first and widened once: two launches on a GPU's host instead of one per
    part (the widening is exact either way)."""
    if len({t.device for t in parts}) > 1:
        parts = [t.to("cpu") for t in parts]
    if len({t.dtype for t in parts}) == 1:
        return torch.cat([t.reshape(-1) for t in parts]).to(torch.float64)
    return torch.cat([t.reshape(-1).to(torch.float64) for t in parts])


@functools.lru_cache(maxsize=64)
def _scaling_line(path: str, first: int, last: int) -> Optional[int]:
    """The first line in ``first..last`` of ``path`` that scales by a name of the world size."""
    for number in range(first, min(last, first + MAX_SCAN) + 1):
        text = linecache.getline(path, number).split("#", 1)[0]
        if _WORLD_NAMES.search(text) and _SCALING.search(text):
            return number
    return None


def _scaling_at(window: _Window) -> list:
    """The first line, from a reached loss call to the backward that reached it (same file), that
    scales by a name of the world size."""
    seen = set()
    for call in window.calls:
        if call.factor is None or not call.site or not call.reached_from:
            continue
        loss, backward = call.site[0], call.reached_from[0]
        key = (loss["file"], loss["line"], backward["line"])
        if loss["file"] != backward["file"] or key in seen:
            continue
        seen.add(key)
        found = _scaling_line(loss["file"], min(loss["line"], backward["line"]), max(loss["line"], backward["line"]))
        if found:
            return [{"file": loss["file"], "line": found, "function": loss.get("function", "")}]
    return []


def close_window(rec: Recorder, step: int, next_sampled: bool) -> None:
    """The optimizer probe's first optimizer stepped (``step``, 1-based): emit the window if it was
    sampled, and open the next one."""
    global _WINDOW
    window = _WINDOW
    _WINDOW = _Window(sampled=next_sampled)
    if not window.sampled or not (window.calls or window.means):
        return
    counts = [c.count for c in window.calls if c.count is not None]
    layout, samples = _grad_samples(window)
    event = rec.stamp(LossWindow(step=step, backwards=window.backwards, calls=[], means=window.means,
                                 scaled=window.scaled, backward_at=window.backward_at,
                                 scaling_at=_scaling_at(window), grad_layout=layout, grad_samples=[]))

    def arrived(host: Optional[list[list]]) -> None:  # the counts and samples, read behind the device
        if host is None:  # never came (the rank ended with its device stuck): the window is not weighed
            return
        values = iter(host[0] if counts else [])
        for call in window.calls:
            count = int(next(values)) if call.count is not None else None
            event.calls.append({"fn": call.fn, "reduction": call.reduction, "count": count, "numel": call.numel,
                                "factor": call.factor, "elementwise": call.elementwise, "site": call.site})
        event.grad_samples = host[1:] if counts else host
        rec.emit_stamped(event)

    rec.host_copies.later([*([_joined(counts)] if counts else []), *samples], arrived)


def install(rec: Recorder) -> Callable[[], None]:
    import torch.nn.functional as functional

    def wrap_loss(fn: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def loss(*args: Any, **kwargs: Any) -> Any:
                if torch.compiler.is_compiling() or not _WINDOW.sampled or _depth[0]:
                    return original(*args, **kwargs)
                _depth[0] += 1
                try:
                    result = original(*args, **kwargs)
                finally:
                    _depth[0] -= 1
                with outside_torch_modes():
                    if torch.is_grad_enabled() and getattr(result, "requires_grad", False):
                        with rec.guard(PROBE, fn):
                            _record_call(fn, result, args, kwargs)
                return result

            return loss

        return make

    for fn in LOSS_FUNCTIONS:
        patch(rec, PROBE, functional, fn, wrap_loss(fn))

    def wrap_backward(original: Any) -> Any:
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling() and _WINDOW.sampled:
                with rec.guard(PROBE, "backward"), outside_torch_modes():
                    _WINDOW.backwards += 1
                    site = callsite.user_frames(sys._getframe(1), 1)
                    if not _WINDOW.backward_at:
                        _WINDOW.backward_at = site
                    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or [])
                    for root in roots:
                        if isinstance(root, torch.Tensor) and root.grad_fn is not None:
                            _walk(root.grad_fn, site)
            return original(tensors, *args, **kwargs)

        return backward

    patch(rec, PROBE, torch.autograd, "backward", wrap_backward)

    def wrap_scale(original: Any) -> Any:
        def scale(self: Any, outputs: Any) -> Any:
            result = original(self, outputs)
            if _WINDOW.sampled and isinstance(result, torch.Tensor) and result.grad_fn is not None:
                _WINDOW.scaler_nodes[id(result.grad_fn)] = result.grad_fn
            return result

        return scale

    from torch.amp.grad_scaler import GradScaler

    patch(rec, PROBE, GradScaler, "scale", wrap_scale)

    def finish() -> None:
        global _WINDOW
        _WINDOW = _Window()

    return finish
