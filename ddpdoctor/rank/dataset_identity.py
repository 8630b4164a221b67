"""A cheap digest of what a map-style dataset holds, so ranks can tell whether a sampler position
names the same sample on each of them.

Indices mean the same sample only when the ranks share one dataset. A dataset each rank builds for
itself (``paths[rank::world_size]``, data generated from the rank) holds different samples behind
the same positions. The digest reads the dataset's own state, never its items: ``__getitem__`` can
read files, open handles before the workers fork, or draw random augmentations, and the probe must
change nothing. It covers the type, the length and, recursively, the attributes: scalars as they
are, strings, sequences, mappings, arrays and tensors by their size and a few evenly spaced
elements, nested datasets (Subset, ConcatDataset, wrappers) and objects in turn, within a fixed
budget of values, so a list of a million paths costs as much as one of a hundred.
"""

from __future__ import annotations

import collections
import hashlib
import types
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["dataset_digest"]

MAX_DEPTH = 6  # containers and objects nested in the dataset (ConcatDataset -> list -> dataset -> list)
MAX_VALUES = 512  # leaf values fed to the digest, in all
EDGE_ITEMS = 8  # first and last items of a sequence, and this many more evenly spaced
MAX_ELEMENTS = 64  # elements of an array or tensor
MAX_STRING = 256  # characters of a string


# Read by their type alone: code, not data.
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_VALUES

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def dataset_digest(dataset: Any) -> Optional[str]:
    """16 hex digits, equal on ranks that built the same dataset; None if it cannot be read."""
    digest = hashlib.blake2b(digest_size=8)
    try:
        with torch.no_grad():
            _feed(digest, dataset, 0, _Budget(), set())
    except Exception:  # a __len__ or a container that fails: no identity, the indices are judged as before
        return None
    return digest.hexdigest()


def _feed(digest: Any, value: Any, depth: int, budget: _Budget, seen: set[int]) -> None:
    kind = type(value)
    digest.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())
    if not budget.take():
        return
    if value is None or isinstance(value, (bool, int, float, complex)):
        digest.update(repr(value).encode())
    elif isinstance(value, str):
        digest.update(f"{len(value)}:{value[:MAX_STRING]}".encode())
    elif isinstance(value, (bytes, bytearray)):
        digest.update(len(value).to_bytes(8, "little") + bytes(value[:MAX_STRING]))
    elif isinstance(value, torch.Tensor):
        _feed_tensor(digest, value)
    elif isinstance(value, np.ndarray) and not value.dtype.hasobject:
        _feed_array(digest, value)
    elif depth >= MAX_DEPTH or id(value) in seen or isinstance(value, _OPAQUE):
        return
    elif isinstance(value, dict):  # built-in containers only: a user's Mapping may load on access
        seen.add(id(value))
        digest.update(str(len(value)).encode())
        for i, (key, item) in enumerate(value.items()):
            if i >= 2 * EDGE_ITEMS:
                break
            _feed(digest, key, depth + 1, budget, seen)
            _feed(digest, item, depth + 1, budget, seen)
    elif isinstance(value, (list, tuple, range, collections.deque, np.ndarray)):  # object arrays item by item
        seen.add(id(value))
        items = value.reshape(-1) if isinstance(value, np.ndarray) else value
        digest.update(str(len(items)).encode())
        for i in _positions(len(items), EDGE_ITEMS):
            _feed(digest, items[int(i)], depth + 1, budget, seen)
    else:
        _feed_object(digest, value, depth, budget, seen)


def _feed_object(digest: Any, value: Any, depth: int, budget: _Budget, seen: set[int]) -> None:
    """A dataset or another object: its length if it has one, then its attributes by name (the
    instance's own, never properties, which could compute anything)."""
    seen.add(id(value))
    length = getattr(type(value), "__len__", None)
    if length is not None:
        try:
            digest.update(f"len={length(value)}".encode())
        except Exception:  # a __len__ that needs state not there yet
            pass
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict):
        return
    for name in sorted(attributes):
        if budget.left <= 0:
            return
        digest.update(name.encode())
        _feed(digest, attributes[name], depth + 1, budget, seen)


def _positions(length: int, edge: int) -> np.ndarray:
    """Sorted distinct positions: the first and last ``edge`` and ``edge`` more evenly spaced."""
    if length <= 3 * edge:
        return np.arange(length)
    return np.unique(np.concatenate([np.arange(edge), np.arange(length - edge, length),
                                     np.linspace(0, length - 1, edge).astype(np.int64)]))


def _flat_sample(shape: tuple[int, ...], size: int) -> tuple[np.ndarray, ...]:
    return np.unravel_index(_positions(size, MAX_ELEMENTS // 3), shape)


def _feed_tensor(digest: Any, tensor: torch.Tensor) -> None:
    """Shape, dtype and a few elements, gathered without copying the tensor (a GPU tensor costs
    one small copy)."""
    digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
    if tensor.numel() == 0:
        return
    try:
        data = tensor.detach()
        picked = data[tuple(torch.as_tensor(i) for i in _flat_sample(tuple(data.shape), data.numel()))] \
            if data.dim() else data.reshape(1)
        digest.update(picked.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    except Exception:  # sparse, quantized, meta, a subclass that refuses indexing: its shape says enough
        digest.update(b"?")


def _feed_array(digest: Any, array: np.ndarray) -> None:
    digest.update(f"{array.shape}{array.dtype}".encode())
    if array.size == 0:
        return
    try:
        picked = array[_flat_sample(array.shape, array.size)] if array.ndim else array.reshape(1)
        digest.update(np.ascontiguousarray(picked).tobytes())
    except Exception:  # a structured or memory-mapped array that cannot be read: its shape says enough
        digest.update(b"?")
