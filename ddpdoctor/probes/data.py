"""Probes on DataLoader iteration: which sample indices each rank consumed in each pass.

Indices are taken where the loader's main process draws them from the (batch) sampler, so the
probe sees the same thing with num_workers > 0 and with custom batch samplers. A pass ends when the
iterator is exhausted, when the same loader starts a new pass, or when the process ends.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch.utils.data import DataLoader, DistributedSampler, Subset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ddpdoctor import callsite
from ddpdoctor.indices import encode_indices, order_hash
from ddpdoctor.probes.patching import patch
from ddpdoctor.recorder import Recorder


class _Pass:
    def __init__(self, rec: Recorder, loader: DataLoader, key: str, number: int, site: list,
                 registry: list) -> None:
        self.rec = rec
        self.num_yielded = 0
        self.registry = registry
        registry.append(self)
        self.key = key
        self.number = number
        self.site = site
        self.batches: list[Any] = []
        self.start_steps = rec.num_steps
        self.open = True
        self.sampler_info = _sampler_info(loader)
        self.dataset = loader.dataset
        base = _base_dataset(loader.dataset)
        self.loader_info = {
            "batch_size": loader.batch_size,
            "drop_last": loader.drop_last,
            "num_workers": loader.num_workers,
            "dataset_len": _safe_len(base),
            "dataset_type": type(base).__name__,
            "subset": base is not loader.dataset,
        }

    def finish(self, *, complete: bool) -> None:
        if not self.open:
            return
        self.open = False
        self.registry.remove(self)
        self._emit(complete=complete, snapshot=False)
        self.batches = []

    def snapshot(self) -> None:
        """Record the pass so far without ending it: a hang or kill must not lose it."""
        if self.open:
            self._emit(complete=False, snapshot=True)

    def _emit(self, *, complete: bool, snapshot: bool) -> None:
        # Workers prefetch: only the batches the loop actually received count as consumed.
        consumed = self.batches[: self.num_yielded]
        flat: Optional[list[int]] = []
        for batch in consumed:
            if isinstance(batch, int):
                flat.append(batch)
            elif isinstance(batch, (list, tuple)) and all(isinstance(i, int) for i in batch):
                flat.extend(batch)
            else:
                flat = None  # samplers yielding keys other than integer positions
                break
        if flat is not None:
            flat = _to_base_indices(self.dataset, flat)
        self.rec.emit(
            "loader_pass",
            loader=self.key,
            number=self.number,
            complete=complete,
            snapshot=snapshot,
            num_batches=len(consumed),
            num_samples=len(flat) if flat is not None else None,
            indices=None if flat is None else encode_indices(flat),
            order=None if flat is None else order_hash(flat),
            steps=self.rec.num_steps - self.start_steps,
            sampler=self.sampler_info,
            site=self.site,
            **self.loader_info,
        )


def _base_dataset(dataset: Any) -> Any:
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def _to_base_indices(dataset: Any, indices: list[int]) -> list[int]:
    """Positions in a (nested) Subset mapped to the underlying dataset, so hand-made shards compare."""
    while isinstance(dataset, Subset):
        mapping = dataset.indices
        indices = [int(mapping[i]) for i in indices]
        dataset = dataset.dataset
    return indices


def _safe_len(obj: Any) -> Optional[int]:
    try:
        return len(obj)
    except TypeError:
        return None


def _real_sampler(loader: DataLoader) -> Any:
    batch_sampler = loader.batch_sampler
    inner = getattr(batch_sampler, "sampler", None)
    return inner if inner is not None else loader.sampler


def _sampler_info(loader: DataLoader) -> dict:
    sampler = _real_sampler(loader)
    info: dict[str, Any] = {"type": type(sampler).__name__,
                            "distributed": isinstance(sampler, DistributedSampler),
                            "batch_sampler": type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else None}
    for attr in ("num_replicas", "rank", "shuffle", "drop_last", "seed", "epoch", "num_samples", "total_size"):
        value = getattr(sampler, attr, None)
        if isinstance(value, (int, bool)):
            info[attr] = value
    if "shuffle" not in info:
        info["shuffle"] = type(sampler).__name__ == "RandomSampler"
    return info


def install(rec: Recorder) -> Callable[[], None]:
    """Patch the DataLoader iterator; returns a function that closes passes still open at exit."""
    open_passes: list[_Pass] = []
    pass_counts: dict[str, int] = {}

    def start_pass(iterator: _BaseDataLoaderIter, loader: DataLoader) -> None:
        if getattr(loader, "_dataset_kind", 0) != 0:  # iterable datasets have no indices
            return
        site = loader.__dict__.get("_ddpdoctor_site") or []
        # Keyed by where the loader was built, so a loader re-created every epoch is one loader.
        key = f"{site[0]['file']}:{site[0]['line']}" if site else "loader"
        for other in [p for p in open_passes if p.key == key]:
            other.finish(complete=False)  # a new pass over the same loader ends the old one
        number = pass_counts.get(key, 0)
        pass_counts[key] = number + 1
        iterator.__dict__["_ddpdoctor_pass"] = _Pass(rec, loader, key, number, site, open_passes)
        rec.set_activity("iterating data")

    def wrap_iter_init(original):
        def __init__(self, loader, *args, **kwargs):
            original(self, loader, *args, **kwargs)
            start_pass(self, loader)

        return __init__

    def wrap_reset(original):
        def _reset(self, loader, first_iter=False):
            if first_iter:  # called from __init__, which already started the pass
                return original(self, loader, first_iter)
            previous = self.__dict__.get("_ddpdoctor_pass")
            if previous is not None:  # persistent workers: the same iterator starts a new pass
                previous.finish(complete=False)
            original(self, loader, first_iter)
            start_pass(self, loader)

        return _reset

    def wrap_next_index(original):
        def _next_index(self):
            index = original(self)
            current = self.__dict__.get("_ddpdoctor_pass")
            if current is not None and current.open:
                current.batches.append(index)
            return index

        return _next_index

    def wrap_next(original):
        def __next__(self):
            try:
                batch = original(self)
            except StopIteration:
                current = self.__dict__.get("_ddpdoctor_pass")
                if current is not None:
                    current.finish(complete=True)
                raise
            current = self.__dict__.get("_ddpdoctor_pass")
            if current is not None:
                current.num_yielded += 1
            rec.progress += 1
            return batch

        return __next__

    def wrap_loader_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.__dict__["_ddpdoctor_site"] = callsite.caller_site()

        return __init__

    patch(_BaseDataLoaderIter, "__init__", wrap_iter_init)
    patch(_BaseDataLoaderIter, "_reset", wrap_reset)
    patch(_BaseDataLoaderIter, "_next_index", wrap_next_index)
    patch(_BaseDataLoaderIter, "__next__", wrap_next)
    patch(DataLoader, "__init__", wrap_loader_init)

    def finish_open_passes() -> None:
        for p in list(open_passes):
            p.finish(complete=False)

    def snapshot_open_passes() -> None:
        for p in list(open_passes):
            p.snapshot()

    rec.on_dump.append(snapshot_open_passes)
    return finish_open_passes
