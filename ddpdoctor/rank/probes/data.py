"""Probes on DataLoader iteration: which sample indices each rank consumed in each pass.

Indices are taken where the loader's main process draws them from the (batch) sampler, so the
probe sees the same thing with num_workers > 0 and with custom batch samplers. A pass ends when the
iterator is exhausted, when the iterator is gone (a loop left with `break`, a batch taken with
`next(iter(loader))`), when persistent workers start the next pass, or when the process ends. Several
passes over one loader may be open at once (an evaluation on the training loader inside the
training loop). What a pass fed (DDP training forwards, optimizer steps) is counted by
:mod:`ddpdoctor.rank.feeding`.
"""

from __future__ import annotations

import collections
import hashlib
import time
import weakref
from typing import Any, Callable, Optional

import numpy as np

from torch.utils.data import (DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler, Subset,
                              SubsetRandomSampler)
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ddpdoctor.rank import bounds, callsite
from ddpdoctor.rank.dataset_identity import dataset_digest
from ddpdoctor.rank.feeding import Fed, FeedTracker
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.probes.sidetable import SideTable
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import LoaderPass, SamplerInfo
from ddpdoctor.schema.indices import encode_indices

PROBE = "data"

# What the probe knows of the script's loaders and iterators, kept beside them (never on them: a
# loader is pickled, copied and inspected by frameworks that rebuild it from its attributes).
SITES: SideTable[list] = SideTable()  # DataLoader -> the user's line that built it
DOMAINS: SideTable[str] = SideTable()  # DataLoader over a Subset -> digest of the base positions it covers
IDENTITIES: SideTable[Optional[str]] = SideTable()  # dataset under every Subset -> digest of what it holds
PASSES: SideTable["_Pass"] = SideTable()  # DataLoader iterator -> its open pass
HEAD_TAIL = 64  # at least this many first and last draws kept in order, to recognise wrap-around padding
MAX_KEEP = 1024  # and at most this many (two batches, if the batches are smaller)
MAX_WRAPPERS = 4  # batch samplers wrapping batch samplers, looked through for the sampler that draws
EVERY_BATCH = 20  # the first batches of a pass are written one by one: early crashes lose nothing
PART_INTERVAL_S = 1.0
# Other probes that follow every pass, iterable datasets included (the content probe): objects with
# started(iterator, loader), yielded(iterator, batch) and ended(iterator, complete) and a ``probe`` name.
LISTENERS: list[Any] = []


def loader_key(loader: DataLoader) -> tuple[str, list]:
    """(key, site) of a loader: keyed by where it was built, so a loader re-created every epoch is one."""
    site = SITES.get(loader) or []
    return (f"{site[0]['file']}:{site[0]['line']}" if site else "loader"), site


def _notify(rec: Recorder, method: str, *args: Any) -> None:
    for listener in LISTENERS:
        with rec.guard(listener.probe, f"DataLoader {method}"):
            getattr(listener, method)(*args)


class _Pass:
    """One pass of this rank over one loader, written in parts as it goes."""

    def __init__(self, rec: Recorder, loader: DataLoader, key: str, number: int, site: list,
                 registry: list, tracker: FeedTracker) -> None:
        self.rec = rec
        self.registry = registry
        self.tracker = tracker
        self.fed = Fed()
        registry.append(self)
        self.key = key
        self.number = number
        self.site = site
        self.drawn: list[Any] = []  # sampler draws not yet written, in order (workers prefetch ahead)
        self.num_yielded = 0  # batches the loop actually received
        self.num_unwritten = 0  # of those, batches not yet written
        self.part = 0
        self.last_write = time.monotonic()
        self.open = True
        self.opaque = False  # the sampler yields keys other than integer positions
        self.order = hashlib.blake2b(digest_size=8)
        self.head: list[int] = []
        self.sampler_info = _sampler_info(loader)
        if self.sampler_info.distributed and self.sampler_info.shuffle and self.sampler_info.epoch is not None:
            rec.epoch = self.sampler_info.epoch  # the training sampler's epoch (evaluation ones do not shuffle)
        self.dataset = loader.dataset
        base = _base_dataset(loader.dataset)
        self.loader_info = {
            "batch_size": loader.batch_size,
            "drop_last": loader.drop_last,
            "num_workers": loader.num_workers,
            "dataset_len": _safe_len(loader.dataset),
            "base_len": _safe_len(base),
            "dataset_type": type(base).__name__,
            "subset": base is not loader.dataset,
            "domain": _domain_digest(loader),
            "dataset_digest": _identity(base),
            "skipped_batches": _skipped_batches(loader),
        }
        self.keep = min(MAX_KEEP, max(HEAD_TAIL, 2 * (_batch_size(loader) or 1)))
        self.keep_fitted = False
        self.tail: collections.deque = collections.deque(maxlen=self.keep)

    def yielded(self) -> None:
        """The loop received a batch: write a part after each of the first batches, then about
        once a second, so a killed rank loses little."""
        self.num_yielded += 1
        self.num_unwritten += 1
        self.tracker.yielded(self.fed)
        if self.num_yielded <= EVERY_BATCH or time.monotonic() - self.last_write >= PART_INTERVAL_S:
            self.write()

    def finish(self, *, complete: bool) -> None:
        if not self.open:
            return
        self.open = False
        with self.rec.guard(PROBE, "loader pass"):
            self.tracker.finished(self.fed)
            if self in self.registry:
                self.registry.remove(self)
        self.write(final=True, complete=complete)
        self.drawn = []

    def write(self, *, final: bool = False, complete: bool = False) -> None:
        """Write the batches received since the last part (a dump request calls this too)."""
        with self.rec.guard(PROBE, "loader pass"):
            fresh = self.drawn[: self.num_unwritten]
            if not fresh and not final and self.part:
                return
            del self.drawn[: self.num_unwritten]
            self.tracker.flush()
            self.num_unwritten = 0
            self.fit_keep(fresh)
            flat = None if self.opaque else _flatten(fresh)
            if flat is None:
                self.opaque = True
            else:
                flat = _to_base_indices(self.dataset, flat)
                self.order.update(flat.astype("<i8").tobytes())
                if len(self.head) < self.keep:
                    self.head.extend(flat[: self.keep - len(self.head)].tolist())
                self.tail.extend(flat[-self.keep:].tolist())
            self.rec.emit(LoaderPass(
                loader=self.key, number=self.number, part=self.part, final=final, complete=complete,
                num_batches=self.num_yielded, num_samples=None if flat is None else len(flat),
                indices=None if flat is None else encode_indices(flat),
                order=None if self.opaque else self.order.hexdigest(),
                head=[] if self.opaque else list(self.head), tail=[] if self.opaque else list(self.tail),
                steps=self.fed.steps, ddp_forwards=self.fed.forwards, sampler=self.sampler_info, site=self.site,
                **self.loader_info))
            self.part += 1
            self.last_write = time.monotonic()

    def fit_keep(self, batches: list[Any]) -> None:
        """Keep two whole batches in order at each end, sized from the first batch drawn when the
        loader does not say its batch size (a batch sampler wrapping another): wrap-around padding
        of a whole batch is recognised only if the first and last batches are kept whole."""
        if self.keep_fitted or not batches:
            return
        self.keep_fitted = True
        first = batches[0]
        size = len(first) if isinstance(first, (list, tuple, np.ndarray)) else 1
        keep = min(MAX_KEEP, max(self.keep, 2 * size))
        if keep > self.keep:
            self.keep = keep
            self.tail = collections.deque(self.tail, maxlen=keep)


def _flatten(batches: list[Any]) -> Optional[np.ndarray]:
    """The draws as one int64 array, or None when the sampler yields anything but integer positions
    (keys, tuples, floats): such a pass is opaque."""
    if not batches:
        return np.empty(0, dtype=np.int64)
    arrays = []
    for batch in batches:
        if isinstance(batch, bool) or not isinstance(batch, (int, list, tuple, np.integer, np.ndarray)):
            return None
        try:
            array_ = np.asarray(batch)
        except (TypeError, ValueError):  # ragged or odd nested keys
            return None
        if array_.ndim > 1 or array_.dtype.kind not in "iu":
            return None
        arrays.append(array_.reshape(-1).astype(np.int64, copy=False))
    return np.concatenate(arrays)


def _base_dataset(dataset: Any) -> Any:
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def _to_base_indices(dataset: Any, indices: np.ndarray) -> np.ndarray:
    """Positions in a (nested) Subset mapped to the underlying dataset, so hand-made shards compare."""
    while isinstance(dataset, Subset):
        indices = _subset_positions(dataset)[indices]
        dataset = dataset.dataset
    return indices


_SUBSET_POSITIONS: "weakref.WeakKeyDictionary[Subset, tuple[int, np.ndarray]]" = weakref.WeakKeyDictionary()


def _subset_positions(subset: Subset) -> np.ndarray:
    """A Subset's indices as an array, converted once per Subset (they can hold millions). Kept
    here, not on the Subset, so nothing extra is pickled to the loader's workers."""
    cached = _SUBSET_POSITIONS.get(subset)
    if cached is None or cached[0] != id(subset.indices) or len(cached[1]) != len(subset.indices):
        cached = (id(subset.indices), np.asarray(subset.indices, dtype=np.int64).reshape(-1))
        _SUBSET_POSITIONS[subset] = cached
    return cached[1]


def _domain_digest(loader: DataLoader) -> Optional[str]:
    """Digest of the base positions a Subset covers, once per loader: ranks sampling the same
    Subset get the same digest, hand-made per-rank shards different ones."""
    if not isinstance(loader.dataset, Subset):
        return None
    cached = DOMAINS.get(loader)
    if cached is None:
        positions = _to_base_indices(loader.dataset, np.arange(len(loader.dataset), dtype=np.int64))
        cached = hashlib.blake2b(positions.astype("<i8").tobytes(), digest_size=8).hexdigest()
        DOMAINS.set(loader, cached)
    return cached


def _identity(dataset: Any) -> Optional[str]:
    """The dataset's identity digest, read once per dataset (at its first pass, before a cache it
    fills while training could make the ranks' copies of one dataset differ)."""
    cached = IDENTITIES.get(dataset)
    if cached is None:
        cached = dataset_digest(dataset)
        IDENTITIES.set(dataset, cached)
    return cached


def _skipped_batches(loader: DataLoader) -> int:
    """Batches a resuming batch sampler skips without drawing them (Accelerate's SkipBatchSampler,
    which `skip_first_batches` and the Hugging Face Trainer use to resume mid-epoch)."""
    skip = getattr(loader.batch_sampler, "skip_batches", 0)
    return skip if isinstance(skip, int) and not isinstance(skip, bool) and skip > 0 else 0


def _safe_len(obj: Any) -> Optional[int]:
    try:
        return len(obj)
    except TypeError:
        return None


def _inner_sampler(sampler: Any) -> Optional[Sampler]:
    """The sampler a (batch) sampler wraps, read from its own attributes (never a property):
    BatchSampler's ``sampler``, or a batch sampler held by another (Accelerate's BatchSamplerShard
    keeps the loader's BatchSampler as ``batch_sampler``)."""
    attributes = getattr(sampler, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    for name in ("batch_sampler", "sampler"):
        inner = attributes.get(name)
        if isinstance(inner, Sampler) and inner is not sampler:
            return inner
    return None


def _real_sampler(loader: DataLoader) -> Any:
    """The sampler that decides the draws: the innermost under the batch samplers that wrap it (a
    custom batch sampler that wraps none draws itself; the loader's own ``sampler`` is then unused).
    A DistributedSampler is where the sharding is decided, so the walk stops there."""
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    for _ in range(MAX_WRAPPERS):
        inner = None if isinstance(sampler, DistributedSampler) else _inner_sampler(sampler)
        if inner is None:
            break
        sampler = inner
    return sampler


def _batch_size(loader: DataLoader) -> Optional[int]:
    """The loader's batch size, or that of the batch sampler it was given."""
    size = loader.batch_size
    if size is None:
        size = getattr(loader.batch_sampler, "__dict__", {}).get("batch_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _population(sampler: Any) -> Optional[int]:
    """How many sample positions the sampler draws from, where its type says: None for a custom
    sampler, and for random draws with replacement or of a set number (some samples are left out
    by design)."""
    try:
        if isinstance(sampler, DistributedSampler):
            return _safe_len(sampler.dataset)
        if isinstance(sampler, SubsetRandomSampler):
            return _safe_len(sampler.indices)
        if isinstance(sampler, RandomSampler) and (sampler.replacement
                                                   or getattr(sampler, "_num_samples", None) is not None):
            return None
        if isinstance(sampler, (SequentialSampler, RandomSampler)):
            return _safe_len(sampler.data_source)
    except Exception:  # a dataset whose __len__ needs what is not there yet: unknown, never a probe error
        return None
    return None


def _sampler_info(loader: DataLoader) -> SamplerInfo:
    sampler = _real_sampler(loader)
    info = SamplerInfo(type=type(sampler).__name__, distributed=isinstance(sampler, DistributedSampler),
                       batch_sampler=type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else None,
                       shuffle=isinstance(sampler, RandomSampler), population=_population(sampler))
    for attr in ("num_replicas", "rank", "shuffle", "drop_last", "seed", "epoch", "num_samples", "total_size"):
        value = getattr(sampler, attr, None)
        if isinstance(value, (int, bool)):
            setattr(info, attr, value)
    return info


def install(rec: Recorder) -> Callable[[], None]:
    """Patch the DataLoader iterator; returns a function that closes passes still open at exit."""
    open_passes: list[_Pass] = []
    pass_counts: dict[str, int] = {}
    training_passes: dict[str, int] = {}  # per loader: finished passes that fed training, for --max-epochs
    tracker = FeedTracker(ddp_probe.total_synced_forwards, lambda: rec.num_steps)

    def finish(p: _Pass, *, complete: bool) -> None:
        if not p.open:
            return
        p.finish(complete=complete)
        if p.fed.forwards or p.fed.steps:
            training_passes[p.key] = training_passes.get(p.key, 0) + 1

    def iterator_gone(p: _Pass) -> None:
        """The pass's iterator was garbage-collected: a loop left with `break`, a `next(iter(loader))`."""
        with rec.guard(PROBE, "loader pass"):
            finish(p, complete=False)

    def start_pass(iterator: _BaseDataLoaderIter, loader: DataLoader) -> None:
        if getattr(loader, "_dataset_kind", 0) != 0:  # iterable datasets have no indices
            return
        site = SITES.get(loader) or []
        # Keyed by where the loader was built, so a loader re-created every epoch is one loader.
        key = f"{site[0]['file']}:{site[0]['line']}" if site else "loader"
        if training_passes.get(key):
            rec.passes = max(rec.passes, training_passes[key])  # the live view's epoch without set_epoch
            bounds.before_pass(rec, training_passes[key])  # --max-epochs: raises RunCut at this boundary
        number = pass_counts.get(key, 0)
        pass_counts[key] = number + 1
        current = _Pass(rec, loader, key, number, site, open_passes, tracker)
        PASSES.set(iterator, current)
        weakref.finalize(iterator, iterator_gone, current)
        rec.set_activity("iterating data")

    def wrap_iter_init(original):
        def __init__(self, loader, *args, **kwargs):
            original(self, loader, *args, **kwargs)
            with rec.guard(PROBE, "DataLoader iterator"):
                start_pass(self, loader)
            _notify(rec, "started", self, loader)

        return __init__

    def wrap_reset(original):
        def _reset(self, loader, first_iter=False):
            if first_iter:  # called from __init__, which already started the pass
                return original(self, loader, first_iter)
            previous = PASSES.get(self)
            if previous is not None:  # persistent workers: the same iterator starts a new pass
                finish(previous, complete=False)
            _notify(rec, "ended", self, False)
            original(self, loader, first_iter)
            with rec.guard(PROBE, "DataLoader iterator"):
                start_pass(self, loader)
            _notify(rec, "started", self, loader)

        return _reset

    def wrap_next_index(original):
        def _next_index(self):
            index = original(self)
            current = PASSES.get(self)
            if current is not None and current.open:
                current.drawn.append(index)
            return index

        return _next_index

    def wrap_next(original):
        def __next__(self):
            started = time.perf_counter()
            try:
                batch = original(self)
            except StopIteration:
                current = PASSES.get(self)
                if current is not None and current.open:
                    finish(current, complete=True)
                _notify(rec, "ended", self, True)
                raise
            rec.timing.data_wait_s += time.perf_counter() - started
            current = PASSES.get(self)
            if current is not None and current.open:
                current.yielded()
            _notify(rec, "yielded", self, batch)
            rec.progress += 1
            return batch

        return __next__

    def wrap_loader_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            with rec.guard(PROBE, "DataLoader.__init__"):
                SITES.set(self, callsite.caller_site())

        return __init__

    patch(rec, PROBE, _BaseDataLoaderIter, "__init__", wrap_iter_init)
    patch(rec, PROBE, _BaseDataLoaderIter, "_reset", wrap_reset)
    patch(rec, PROBE, _BaseDataLoaderIter, "_next_index", wrap_next_index)
    patch(rec, PROBE, _BaseDataLoaderIter, "__next__", wrap_next)
    patch(rec, PROBE, DataLoader, "__init__", wrap_loader_init)

    def finish_open_passes() -> None:
        for p in list(open_passes):
            finish(p, complete=False)

    def write_open_passes() -> None:
        for p in list(open_passes):
            p.write()

    rec.on_dump.append(write_open_passes)
    return finish_open_passes
