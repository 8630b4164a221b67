"""What must agree across ranks for an optimizer's steps, as a digest and, when it changes, the detail.

The digest covers the ``training`` flag of every module of each DDP module the optimizer steps,
``requires_grad`` of each of their parameters, every number and flag of the optimizer's param
groups, autocast at the DDP module's last training forward, and a GradScaler's scale. Computing it
reads one attribute per module and parameter (no tensor data, no collective); the detail, with
names, is built only when the digest changes on this process.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Optional

import torch

MAX_NAMES = 24  # names kept per list of the detail: enough to explain, bounded for huge models


def flags(ddp: torch.nn.Module) -> tuple[bytes, bytes]:
    """``training`` of the wrapper and every module under it, ``requires_grad`` of every parameter,
    in registration order (the same order on every rank that built the same model)."""
    modes = bytearray()
    grads = bytearray()
    stack = [ddp]
    while stack:
        module = stack.pop()
        modes.append(module.training)
        for p in module._parameters.values():
            if p is not None:
                grads.append(p.requires_grad)
        children = [c for c in module._modules.values() if c is not None]
        stack.extend(reversed(children))
    return bytes(modes), bytes(grads)


def _plain(value: Any, *, exact: bool) -> Any:
    """A hyperparameter as JSON can hold it. ``exact=False`` never reads a device tensor (no sync):
    a tensor stands for its identity and version counter, which change when it is written."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v, exact=exact) for v in value]
    if isinstance(value, torch.Tensor):
        if not exact:
            return ("tensor", id(value), value._version)
        if value.numel() == 1:
            return _plain(value.item(), exact=True)
        return f"tensor{list(value.shape)}"
    return type(value).__name__


def group_values(optimizer: torch.optim.Optimizer, *, exact: bool = True) -> list[dict]:
    """Every number and flag of each param group (the ``params`` list left out)."""
    return [{k: _plain(v, exact=exact) for k, v in group.items() if k != "params"}
            for group in optimizer.param_groups]


def fast_signature(optimizer: torch.optim.Optimizer) -> list[tuple]:
    """The param groups' values, compared every step to notice a write (no device sync)."""
    return [tuple((k, _plain(v, exact=False)) for k, v in group.items() if k != "params")
            for group in optimizer.param_groups]


def changed_keys(before: list[tuple], after: list[tuple]) -> list[list]:
    """[[group, key]] whose value differs; a group that appeared or vanished is [group, "*"]."""
    out: list[list] = []
    for index in range(max(len(before), len(after))):
        if index >= len(before) or index >= len(after):
            out.append([index, "*"])
            continue
        old, new = dict(before[index]), dict(after[index])
        out.extend([index, key] for key in sorted(old.keys() | new.keys(), key=str) if old.get(key) != new.get(key))
    return out


def digest(groups: list[dict], parts: Iterable[tuple], scale: Optional[float]) -> str:
    """12 hex characters over the groups, each DDP module's (index, modes, requires_grad, autocast),
    and the scale."""
    h = hashlib.blake2b(digest_size=6)
    h.update(repr(groups).encode())
    for index, modes, grads, autocast in parts:
        h.update(f"|{index}|{autocast}|".encode())
        h.update(modes)
        h.update(b"|")
        h.update(grads)
    h.update(repr(scale).encode())
    return h.hexdigest()


def modes_detail(ddp: torch.nn.Module) -> dict:
    """Modules in eval mode by type, and where a module's mode differs from its parent's."""
    inner = getattr(ddp, "module", ddp)
    count = 0
    evals: dict[str, int] = {}
    flips: list[list] = []
    if inner.training != ddp.training:
        flips.append(["(wrapper)", type(ddp).__name__, ddp.training])
    stack: list[tuple[str, torch.nn.Module, bool]] = [("", inner, ddp.training)]
    while stack:
        name, module, parent_training = stack.pop()
        count += 1
        if not module.training:
            evals[type(module).__name__] = evals.get(type(module).__name__, 0) + 1
        if module.training != parent_training and len(flips) < MAX_NAMES:
            flips.append([name, type(module).__name__, module.training])
        children = [(f"{name}.{k}" if name else k, c) for k, c in module._modules.items() if c is not None]
        stack.extend((n, c, module.training) for n, c in reversed(children))
    return {"count": count, "eval": evals, "flips": flips}


def frozen_detail(ddp: torch.nn.Module) -> dict:
    """How many parameters are frozen, named by the largest modules whose parameters all are."""
    inner = getattr(ddp, "module", ddp)
    names: list[str] = []

    def visit(prefix: str, module: torch.nn.Module) -> tuple[int, int, list[str]]:
        total = frozen = 0
        local: list[str] = []
        for key, p in module._parameters.items():
            if p is None:
                continue
            total += 1
            if not p.requires_grad:
                frozen += 1
                local.append(f"{prefix}.{key}" if prefix else key)
        for key, child in module._modules.items():
            if child is None:
                continue
            t, f, sub = visit(f"{prefix}.{key}" if prefix else key, child)
            total, frozen = total + t, frozen + f
            local.extend(sub)
        if total and frozen == total and prefix:
            return total, frozen, [f"{prefix}.*"]
        return total, frozen, local

    total, frozen, names = visit("", inner)
    if total and frozen == total:
        names = ["*"]
    return {"count": total, "frozen": frozen, "names": names[:MAX_NAMES], "more": max(0, len(names) - MAX_NAMES)}
