"""How big an optimizer's update is next to what the weights can represent.

A weight whose update is smaller than half the spacing of its dtype at its value never changes:
the update rounds away. That is what correct code does with a bias before a norm layer (its
gradient is mathematically zero, numerically 1e-9) under SGD, or with LayerNorm scales kept in
bfloat16 (spacing 2**-7 at 1.0) under AdamW at lr 3e-4. The optimizer-params check must tell that
apart from an update that should have moved the weight, so the rank measures it, right after the
step that left the weight unchanged, from the optimizer's own state: the direction this step used.

The tensor work is a few fused element-wise kernels per examined parameter on its own device and
one host copy per device; it runs only for parameters a step left unchanged, a few times per run.
Sharded tensors (FSDP2's DTensors) are measured on the rank's local shard, with no collective; a
parameter whose bytes cannot be read is not measured.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Optional

import torch

from ddpdoctor.rank.fingerprint import readable

__all__ = ["examine", "spacing"]


def spacing(weights: torch.Tensor) -> torch.Tensor:
    """The distance from each element's magnitude to the next representable value of its dtype, in
    float32: ``eps * 2**floor(log2(|w|))`` for normal values, the subnormal spacing below them."""
    info = torch.finfo(weights.dtype)
    magnitude = weights.detach().abs().float().clamp(min=info.tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * info.eps


def _number(value: object) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)  # type: ignore[arg-type]


def _direction(optimizer: torch.optim.Optimizer, param: torch.Tensor, group: dict) -> Optional[torch.Tensor]:
    """The step direction the optimizer's last step applied to ``param`` (times the learning rate it is
    the update), from its state after that step; None for an optimizer whose rule is not known here."""
    raw = optimizer.state.get(param) or {}
    state = {key: _local(value) for key, value in raw.items()}
    local_grad, local_param = _local(param.grad), _local(param)
    if local_grad is None or local_param is None or any(state[k] is None and raw[k] is not None for k in raw):
        return None  # a tensor whose bytes this rank cannot read
    grad = local_grad.detach().float()
    param = local_param
    if "exp_avg" in state and "exp_avg_sq" in state and "betas" in group and "eps" in group:
        step = max(_number(state.get("step", 1)), 1.0)
        beta1, beta2 = (_number(b) for b in group["betas"])
        second = (state.get("max_exp_avg_sq") if group.get("amsgrad") and "max_exp_avg_sq" in state
                  else state["exp_avg_sq"])
        first = state["exp_avg"].detach().float() / (1 - beta1**step)
        second = second.detach().float() / (1 - beta2**step)
        direction = first.abs() / (second.sqrt() + _number(group["eps"]))
        decay = _number(group.get("weight_decay") or 0.0)
        if decay and (isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay")):
            direction = direction + decay * param.detach().abs().float()
        return direction
    if isinstance(optimizer, torch.optim.SGD):
        buffer = state.get("momentum_buffer")
        if buffer is None:
            decay = _number(group.get("weight_decay") or 0.0)
            return (grad + decay * param.detach().float()).abs() if decay else grad.abs()
        buffer = buffer.detach().float()
        if group.get("nesterov"):
            return (grad + _number(group.get("momentum") or 0.0) * buffer).abs()
        return buffer.abs()
    return None


def _local(value: Any) -> Any:
    """A tensor as its rank's readable local bytes (see fingerprint.readable), anything else as is."""
    return readable(value) if isinstance(value, torch.Tensor) else value


def examine(optimizer: torch.optim.Optimizer, positions: list[int]) -> tuple[dict[str, list], Optional[float]]:
    """For the parameters at ``positions`` of ``optimizer`` (in param-group order), each
    ``[gradient RMS, update ratio]`` (see :class:`ddpdoctor.schema.events.UnchangedWeights`), and the
    median gradient RMS over all its parameters with a gradient."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    with torch.no_grad():
        grads = {id(p): readable(p.grad) for p in params if p.grad is not None}
        with_grad = [p for p in params if grads.get(id(p)) is not None and grads[id(p)].numel()]
        norms = torch._foreach_norm([grads[id(p)].detach() for p in with_grad]) if with_grad else []
        pending: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
        slots: dict[torch.device, list[tuple[str, int]]] = defaultdict(list)  # (what, position) per value
        for p, norm in zip(with_grad, norms):
            pending[p.device].append(norm.float() / math.sqrt(grads[id(p)].numel()))
            slots[p.device].append(("rms", id(p)))
        for position in positions:
            p = params[position]
            weights = readable(p)
            if grads.get(id(p)) is None or weights is None or not weights.numel():
                continue
            group = group_of[id(p)]
            direction = _direction(optimizer, p, group)
            if direction is None or not p.is_floating_point():
                continue
            lr = group.get("lr", 0.0)
            update = direction * (lr.detach().float() if isinstance(lr, torch.Tensor) else float(lr))
            pending[p.device].append((update / spacing(weights)).max())
            slots[p.device].append(("ratio", position))
        rms: dict[int, float] = {}
        ratios: dict[int, float] = {}
        for device, values in pending.items():
            for (what, key), value in zip(slots[device], torch.stack(values).tolist()):  # one host copy per device
                (rms if what == "rms" else ratios)[key] = value
    out = {str(position): [rms.get(id(params[position])), ratios.get(position)] for position in positions}
    known = sorted(v for v in rms.values() if math.isfinite(v))
    return out, (known[len(known) // 2] if known else None)
