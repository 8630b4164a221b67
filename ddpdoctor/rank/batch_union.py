"""The global batch of one step from the ranks' batches, for --against-one-rank's replay.

A batch is whatever a DataLoader yields: a tensor, or tuples, lists, dicts (and dict subclasses such as
Hugging Face's ``BatchEncoding``) of tensors and plain values. Joining the ranks' batches is the exact
global batch when they differ only along the batch dimension. Batches padded per rank (to each rank's
own longest sequence) cannot be joined that way: padding values are the collate function's business,
so the replay collates the union of the ranks' sample indices with the loader's own ``collate_fn``
instead, after checking that collating each rank's indices gives back exactly that rank's batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Sequence

import collections
import hashlib

import torch

__all__ = ["copy_batch", "join", "same", "largest_tensor", "collate_union", "row_prefixes", "same_rows"]


def _rebuild(like: Any, values: Any) -> Any:
    """A container of ``like``'s type holding ``values`` (a plain dict or list where the type cannot be rebuilt)."""
    if isinstance(like, Mapping):
        try:
            return type(like)(values)
        except Exception:
            return dict(values)
    if isinstance(like, tuple) and hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*values)
    try:
        return type(like)(values)
    except Exception:
        return list(values)


def copy_batch(batch: Any) -> Any:
    """A copy whose tensors the script cannot change afterwards (it may normalize a batch in place)."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().clone()
    if isinstance(batch, Mapping):
        return _rebuild(batch, {k: copy_batch(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return _rebuild(batch, [copy_batch(v) for v in batch])
    return batch


def _structured(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, Mapping, list, tuple))


def join(batches: Sequence[Any]) -> Any:
    """The ranks' batches as one batch, in rank order: tensors concatenated along the first dimension,
    containers joined element by element, lists of plain values (texts, ids) concatenated. ValueError
    naming what differs where they cannot be joined exactly."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(b, torch.Tensor) for b in batches):
            raise ValueError("a tensor on one rank is not a tensor on another")
        if first.dim() == 0:
            if all(torch.equal(first, b) for b in batches[1:]):
                return first
            raise ValueError("the ranks' batches hold different scalars")
        shapes = {tuple(b.shape[1:]) for b in batches}
        if len(shapes) > 1:
            raise ValueError(f"the ranks' batches have shapes {[list(b.shape) for b in batches]}, which differ beyond "
                             "the batch dimension (padded per rank)")
        return torch.cat(list(batches))
    if isinstance(first, Mapping):
        if any(not isinstance(b, Mapping) or set(b) != set(first) for b in batches):
            raise ValueError("the ranks' batches have different keys")
        return _rebuild(first, {k: join([b[k] for b in batches]) for k in first})
    if isinstance(first, (list, tuple)):
        if any(not isinstance(b, (list, tuple)) for b in batches):
            raise ValueError("the ranks' batches have different structures")
        if any(_structured(v) for b in batches for v in b):  # (inputs, labels): joined element by element
            if len({len(b) for b in batches}) > 1:
                raise ValueError("the ranks' batches have different structures")
            return _rebuild(first, [join([b[i] for b in batches]) for i in range(len(first))])
        return _rebuild(first, [v for b in batches for v in b])  # one plain value per sample
    if all(b == first for b in batches[1:]):
        return first
    raise ValueError(f"the ranks' batches hold different values ({first!r} on rank 0)")


def same(a: Any, b: Any) -> bool:
    """Whether two batches are identical, tensor for tensor."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (isinstance(a, Mapping) and isinstance(b, Mapping) and set(a) == set(b)
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    try:
        return bool(a == b)
    except Exception:
        return False


def largest_tensor(batch: Any) -> int:
    """Elements of the batch's largest tensor (0: none)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return max((largest_tensor(v) for v in values), default=0)


def collate_union(dataset: Any, collate: Callable[[list], Any], indices: Sequence[Sequence[int]],
                  recorded: Sequence[Any]) -> Any:
    """The loader's own collation of the union of the ranks' sample ``indices`` (rank order), after
    checking that collating each rank's indices gives back exactly the batch that rank was fed; the
    dataset's random draws (augmentation) do not touch the process's generators. ValueError when a
    rank's batch does not come back (items that change from read to read)."""
    with torch.random.fork_rng(devices=[]):
        for rank, (own, batch) in enumerate(zip(indices, recorded)):
            if not same(collate([dataset[i] for i in own]), batch):
                raise ValueError(f"reading rank {rank}'s samples again does not give back the batch it was fed (the "
                                 "dataset's items change from read to read, e.g. random augmentation)")
        return collate([dataset[i] for own in indices for i in own])


PREFIX = 256  # elements kept of each input row: enough to tell samples apart, bounded memory


@torch.no_grad()
def row_prefixes(tensor: torch.Tensor) -> torch.Tensor:
    """The first PREFIX elements of each row of ``tensor``, flattened, on the CPU."""
    rows = tensor.detach().reshape(tensor.shape[0], -1)
    return rows[:, :PREFIX].to("cpu", copy=True)


def same_rows(theirs: Sequence[torch.Tensor], mine: Sequence[torch.Tensor]) -> bool:
    """Whether two lists of row prefixes hold the same rows, in any order, over their common width (a
    sequence padded to its own rank's longest one and to the global batch's longest one compare alike)."""
    if not theirs and not mine:
        return True
    if not theirs or not mine:
        return False
    width = min(t.shape[1] for t in [*theirs, *mine])

    def rows(parts: Sequence[torch.Tensor]) -> collections.Counter:
        joined = torch.cat([p[:, :width].to(torch.float64) if p.is_floating_point() else p[:, :width].to(torch.int64)
                            for p in parts])
        return collections.Counter(hashlib.blake2b(r.contiguous().numpy().tobytes(), digest_size=8).digest()
                                   for r in joined)

    kinds = {p.is_floating_point() for p in [*theirs, *mine]}
    return len(kinds) == 1 and rows(theirs) == rows(mine)
