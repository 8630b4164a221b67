"""Probe on sample content: row fingerprints of every DataLoader batch and of every DDP training
forward's input, so overlap between ranks shows where sampler indices cannot (iterable datasets,
per-rank file orders, hand-written batching). The fingerprint is in ddpdoctor/rank/row_hashes.py.

Two sources, written as ContentPass events in parts (first batch, then about once a second, and at
the end), so a crash loses little:
- "loader": a DataLoader's collated output (first tensor in it), one stream per pass;
- "forward": the first tensor argument of a DDP module's forward with grad enabled in train mode,
  in windows of ``FORWARD_WINDOW`` forwards, tagged with the loader pass that fed them, if any.
A batch that goes straight from the loader into the model is fingerprinted once.

Memory per rank and pass: at most ``MAX_KEPT_ROWS`` hashes (8 bytes each); beyond that the
sampling level rises and only rows whose hash has that many leading zero bits are kept, the same
rows on every rank. The first ``SEQUENCE_ROWS`` kept rows are also written in feeding order, so
the analysis can tell ranks reading one stream in the same order from ranks drawing at random.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import time
import weakref
from array import array
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from ddpdoctor.rank import row_hashes as fingerprints
from ddpdoctor.rank.feeding import Fed, FeedTracker
from ddpdoctor.rank.probes import data as data_probe
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes.sidetable import SideTable
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.torch_modes import outside_torch_modes
from ddpdoctor.schema.events import ContentPass
from ddpdoctor.schema.indices import encode_indices

PROBE = "content"
MAX_KEPT_ROWS = 8192  # per pass (or window) and rank
STREAMS: SideTable["_Stream"] = SideTable()  # DataLoader iterator -> its content pass
FORWARD_WINDOW = 64  # DDP training forwards per window of the forward-input stream
SEQUENCE_ROWS = 1024  # per pass (or window) and rank: kept rows also written in feeding order
PART_INTERVAL_S = 1.0


class _Stream:
    """One pass of one loader, or one window of one DDP module's inputs, on this rank."""

    def __init__(self, rec: Recorder, registry: list, *, source: str, key: str, number: int, site: list,
                 feeds: Optional[str] = None, dataset_type: str = "", iterable: bool = False,
                 num_workers: int = 0, tracker: Optional[FeedTracker] = None) -> None:
        self.rec, self.registry = rec, registry
        self.tracker = tracker  # loader passes: what their batches fed (forward windows count their own)
        self.fed = Fed()
        registry.append(self)
        self.fields = dict(source=source, key=key, number=number, site=site, feeds=feeds, dataset_type=dataset_type,
                           iterable=iterable, num_workers=num_workers, epoch=rec.epoch)
        self.key, self.feeds = key, feeds
        self.start_steps = rec.num_steps
        self.start_forwards = ddp_probe.total_synced_forwards()
        self.order = hashlib.blake2b(digest_size=8)
        self.level = 0
        self.kept: list[int] = []  # every kept hash at the current level, to know when to raise it
        self.fresh: list[int] = []  # kept hashes not yet written, in feeding order
        self.sequenced = 0  # kept hashes written in feeding order so far (up to SEQUENCE_ROWS)
        self.head: list[int] = []
        self.tail: collections.deque = collections.deque(maxlen=64)
        self.num_batches = self.num_rows = self.batch_rows = self.part = 0
        self.digests: list[str] = []  # forward windows: each forward's batch digest not yet written
        self.last_hashes: Optional[list[int]] = None  # loader passes: the rows of the batch last yielded
        self.first_forward: Optional[int] = None
        self.last_write = time.monotonic()
        self.open = True

    def add(self, hashes: list[int]) -> None:
        self.num_batches += 1
        self.num_rows += len(hashes)
        if not self.batch_rows:
            self.batch_rows = len(hashes)
            self.tail = collections.deque(maxlen=min(1024, max(64, 2 * len(hashes))))
        self.order.update(array("q", hashes).tobytes())
        if len(self.head) < self.tail.maxlen:
            self.head.extend(hashes[: self.tail.maxlen - len(self.head)])
        self.tail.extend(hashes)
        shift = 63 - self.level
        kept = [h for h in hashes if h >> shift == 0]
        self.kept.extend(kept)
        self.fresh.extend(kept)
        while len(self.kept) > MAX_KEPT_ROWS:
            self.level += 1
            shift = 63 - self.level
            self.kept = [h for h in self.kept if h >> shift == 0]
            self.fresh = [h for h in self.fresh if h >> shift == 0]
        if self.num_batches == 1 or time.monotonic() - self.last_write >= PART_INTERVAL_S:
            self.write()

    def write(self, *, final: bool = False, complete: bool = False) -> None:
        with self.rec.guard(PROBE, "content pass"):
            if not self.fresh and not self.digests and not final and self.part:
                return
            if self.tracker is not None:
                self.tracker.flush()
                steps, forwards = self.fed.steps, self.fed.forwards
            else:
                steps = self.rec.num_steps - self.start_steps
                forwards = ddp_probe.total_synced_forwards() - self.start_forwards
            sequence = self.fresh[: max(0, SEQUENCE_ROWS - self.sequenced)]
            self.sequenced += len(sequence)
            self.rec.emit(ContentPass(
                **self.fields, part=self.part, final=final, complete=complete, num_batches=self.num_batches,
                num_rows=self.num_rows, batch_rows=self.batch_rows, level=self.level,
                hashes=encode_indices(self.fresh), order=self.order.hexdigest(), head=list(self.head),
                tail=list(self.tail), steps=steps, ddp_forwards=forwards, first_forward=self.first_forward,
                digests=self.digests, sequence=sequence))
            self.fresh = []
            if self.first_forward is not None:
                self.first_forward += len(self.digests)  # the next part's first forward
            self.digests = []
            self.part += 1
            self.last_write = time.monotonic()

    def finish(self, *, complete: bool) -> None:
        if not self.open:
            return
        self.open = False
        if self.tracker is not None:
            self.tracker.finished(self.fed)
        if self in self.registry:
            self.registry.remove(self)
        if self.num_batches:
            self.write(final=True, complete=complete)
        self.kept = self.fresh = []


def first_tensor(batch: Any, depth: int = 0) -> Optional[torch.Tensor]:
    """The first tensor in a batch: the batch itself, or the first found in a tuple, list or dict."""
    if isinstance(batch, torch.Tensor):
        return batch
    if depth >= 3:
        return None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for item in items:
        found = first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def epoch_intent(dataset: Any) -> dict:
    """What a dataset says about reshuffling between epochs, read without running its code
    (attributes only, no properties): a set_epoch method, its epoch attribute, a shuffle flag."""
    fields: dict[str, Any] = {"set_epoch_method": callable(getattr(type(dataset), "set_epoch", None))}
    for name in ("epoch", "_epoch", "current_epoch"):
        value = inspect.getattr_static(dataset, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            fields["dataset_epoch"] = value
            break
    shuffle = inspect.getattr_static(dataset, "shuffle", None)
    shuffling = inspect.getattr_static(dataset, "_shuffling", None)  # Hugging Face datasets' IterableDataset
    if isinstance(shuffle, bool) or shuffling is not None:
        fields["declares_shuffle"] = bool(shuffle) or shuffling is not None
    return fields


class _ContentProbe:
    """Listens to the data probe's loader passes and to DDP modules' forwards."""

    probe = PROBE

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.streams: list[_Stream] = []
        self.pass_counts: dict[str, int] = {}
        self.window_counts: dict[tuple[int, Optional[str]], int] = {}
        self.windows: dict[int, _Stream] = {}  # DDP module index -> its open window
        self.feeding: Optional[_Stream] = None  # the loader pass that yielded last, while open
        self.last: tuple[Any, int, list[int]] = (None, -1, [])  # (weakref to tensor, its version, hashes)
        self.tracker = FeedTracker(ddp_probe.total_synced_forwards, lambda: rec.num_steps)
        self.forward_counts: dict[int, int] = {}  # DDP module index -> training forwards fingerprinted

    def hashes(self, tensor: Any) -> Optional[list[int]]:
        """Row hashes of ``tensor``, reused when the same unmodified tensor was just fingerprinted."""
        if not fingerprints.fingerprintable(tensor):
            return None
        cached = self.cached(tensor)
        if cached is not None:
            return cached
        found = fingerprints.row_hashes(tensor)
        self.last = (weakref.ref(tensor), tensor._version, found)
        return found

    def cached(self, tensor: torch.Tensor) -> Optional[list[int]]:
        """The hashes of ``tensor`` when it is the one last fingerprinted, unmodified since and its
        hashes in; None otherwise."""
        ref, version, hashes = self.last
        if hashes is not None and ref is not None and ref() is tensor and tensor._version == version:
            return hashes
        return None

    # -- DataLoader passes (called by the data probe) -------------------------------------------
    def started(self, iterator: Any, loader: Any) -> None:
        key, site = data_probe.loader_key(loader)
        number = self.pass_counts.get(key, 0)
        self.pass_counts[key] = number + 1
        stream = _Stream(self.rec, self.streams, source="loader", key=key, number=number, site=site,
                         dataset_type=type(data_probe._base_dataset(loader.dataset)).__name__,
                         iterable=getattr(loader, "_dataset_kind", 0) != 0, num_workers=loader.num_workers,
                         tracker=self.tracker)
        stream.fields.update(epoch_intent(loader.dataset))
        STREAMS.set(iterator, stream)
        weakref.finalize(iterator, self._gone, stream)  # a loop left with `break`: the pass ends with its iterator

    def _gone(self, stream: _Stream) -> None:
        with self.rec.guard(PROBE, "content pass"):
            stream.finish(complete=False)

    def yielded(self, iterator: Any, batch: Any) -> None:
        stream = STREAMS.get(iterator)
        if stream is None or not stream.open:
            return
        self.feeding = stream
        self.tracker.yielded(stream.fed)
        with outside_torch_modes():
            hashes = self.hashes(first_tensor(batch))
        stream.last_hashes = hashes
        if hashes:
            stream.add(hashes)

    def ended(self, iterator: Any, complete: bool) -> None:
        stream = STREAMS.get(iterator)
        if stream is not None:
            stream.finish(complete=complete)

    # -- DDP forwards ---------------------------------------------------------------------------
    def on_forward(self, module: torch.nn.Module, state: Any, args: tuple, kwargs: dict) -> None:
        """A DDP wrapper's forward: its first input tensor's rows, in the window of its feeding pass.
        On a GPU the rows' hashes reach the host behind the device (rank/host_copies.py): a forward
        never waits for the previous step to finish; the window is told what fed it now."""
        if not (torch.is_grad_enabled() and module.training):
            return
        with self.rec.guard(PROBE, "forward input"):
            tensor = first_tensor(list(args) + list(kwargs.values()))
            if not fingerprints.fingerprintable(tensor):
                return
            feeding = self.open_feeding()
            fed = (feeding, feeding.last_hashes if feeding is not None else None, state.index,
                   state.last_forward_site)
            cached = self.cached(tensor)
            if cached is not None:
                self._forward_rows(cached, *fed)
                return
            sums, width = fingerprints.start(tensor)
            # The hashes are filled in when they arrive; only a weak reference waits with them, so
            # the batch is not kept alive for the step it may take.
            ref, version = weakref.ref(tensor), tensor._version
            self.last = (ref, version, None)

            def arrived(host: Optional[list[list]]) -> None:
                if host is None:
                    return
                hashes = fingerprints.mix(host[0], width)
                if self.last[0] is ref:
                    self.last = (ref, version, hashes)
                self._forward_rows(hashes, *fed)

            self.rec.host_copies.later([sums], arrived)

    def _forward_rows(self, hashes: Optional[list[int]], feeding: Optional[_Stream],
                      feeding_hashes: Optional[list[int]], index: int, site: list) -> None:
        """A training forward's rows, in the window of DDP module ``index`` fed by ``feeding``."""
        if not hashes:
            return
        number = self.forward_counts.get(index, 0) + 1
        self.forward_counts[index] = number
        window = self.window(index, number, site, feeding)
        digest = hashlib.blake2b(array("q", hashes).tobytes(), digest_size=8).hexdigest()
        # "s:": not the batch the feeding loader yielded (noise, a hand-made batch): made in the script
        window.digests.append(digest if feeding is not None and hashes == feeding_hashes else f"s:{digest}")
        window.add(hashes)

    def open_feeding(self) -> Optional[_Stream]:
        """The loader pass whose batches feed the model now (None once it ended)."""
        return self.feeding if self.feeding is not None and self.feeding.open else None

    def window(self, index: int, forward: int, site: list, feeding: Optional[_Stream]) -> _Stream:
        """The open window of DDP module ``index``; a new one (starting at training forward
        ``forward``, called from ``site``) after FORWARD_WINDOW forwards or when another loader pass
        (or none: ``feeding``) feeds the model."""
        feeds = f"{feeding.key}#{feeding.fields['number']}" if feeding is not None else None
        current = self.windows.get(index)
        if current is not None and current.open and current.feeds == feeds and current.num_batches < FORWARD_WINDOW:
            return current
        if current is not None:
            current.finish(complete=True)
        number = self.window_counts.get((index, feeds), 0)
        self.window_counts[(index, feeds)] = number + 1
        window = _Stream(self.rec, self.streams, source="forward", key=f"ddp{index}", number=number,
                         site=list(site or []), feeds=feeds,
                         dataset_type=feeding.fields["dataset_type"] if feeding else "",
                         iterable=bool(feeding and feeding.fields["iterable"]))
        window.first_forward = forward
        self.windows[index] = window
        return window

    def finish_all(self) -> None:
        for stream in list(self.streams):
            stream.finish(complete=False)

    def write_all(self) -> None:
        for stream in list(self.streams):
            stream.write()


def install(rec: Recorder) -> Callable[[], None]:
    """Listen to the data probe's passes and to every DDP module wrapped from now on."""
    probe = _ContentProbe(rec)
    data_probe.LISTENERS.append(probe)
    on_forward = probe.on_forward
    ddp_probe.BEFORE_FORWARD.append(on_forward)
    rec.on_dump.append(probe.write_all)

    def finish() -> None:
        probe.finish_all()
        if probe in data_probe.LISTENERS:
            data_probe.LISTENERS.remove(probe)
        if on_forward in ddp_probe.BEFORE_FORWARD:
            ddp_probe.BEFORE_FORWARD.remove(on_forward)

    return finish
