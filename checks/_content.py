"""Findings from sample fingerprints (ContentPass evidence), for sampler-disjoint and set-epoch.

The statistics are in ddpdoctor/analysis/content.py; this module turns them into findings: which
pass overlapped, where the data came from, and the fix for the pattern recognised.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional

from ddpdoctor.analysis import content, facts
from ddpdoctor.analysis.api import EvidenceRecord, Finding, Location, evidence_field
from ddpdoctor.analysis.content import Overlap, Stream
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.derived import derived
from ddpdoctor.analysis.index_sets import distinct_indices, overlap
from ddpdoctor.analysis.symptoms import EpochNotSet, SamplesOverlap
from ddpdoctor.schema.events import ContentPass, LoaderPass
from ddpdoctor.schema.findings import ABSENT

_FIX_ITERABLE = ("Shard the stream by rank and by worker: in `__iter__`, keep every (world_size * num_workers)-th "
                 "sample starting at rank * num_workers + worker_id (rank from dist.get_rank(), worker from "
                 "torch.utils.data.get_worker_info()), or use your streaming library's split by node and by worker.")
_FIX_ORDER = ("Build the dataset in the same order on every rank: sort the file list (`sorted(glob(...))`, "
              "`sorted(os.listdir(...))`) or shuffle it with a fixed seed (`random.Random(SEED).shuffle(files)`), "
              "and let DistributedSampler do the per-epoch shuffling.")
# Identical batches at the same training forward on several ranks: at least this many forwards, and
# at least this share of the forwards compared (a constant input now and then is not a pattern).
MIN_SAME_FORWARDS = 2
SAME_FRACTION = 0.5
# Rows of one rank's loader pass that repeat another of its rows (positions drawn once), from which
# identical batches on disjoint sample positions are the data's own (every sample alike).
IDENTICAL_ROWS = 0.5
_FIX_RANK_LOCAL = ("Give each rank a disjoint part of the data: build the dataset the same way on every rank and "
                   "shard it with `DistributedSampler(dataset)`, or keep a dataset per rank built from a disjoint "
                   "slice of a list sorted the same way everywhere (`sorted(files)[rank::world_size]`).")
_FIX_FORWARD = ("Give each rank its own part of the data: a DataLoader with `DistributedSampler(dataset)`, or "
                "batches drawn per rank (a generator seeded with seed + rank, or index ranges split by rank).")
_FIX_INDEX = ("Make the dataset's `__getitem__(index)` return the sample at `index` (draw synthetic samples from a "
              "generator seeded with the index, or with seed + rank), so disjoint positions give different samples.")
_FIX_MADE = ("Draw the inputs the script makes (noise, synthetic batches) per rank: from a `torch.Generator` seeded "
             "with seed + rank, or seed each rank's global generator with seed + rank after the model is built "
             "and wrapped (so the replicas still start equal).")


# The evidence of the findings made here. The overlap statistics (content.Overlap.as_evidence) and the
# order statistics (content.Order.as_evidence) are fields of their own, in the order those give them.

@dataclass(frozen=True)
class LoaderOverlap(EvidenceRecord, SamplesOverlap):
    """A training loader pass whose samples several ranks fed, by their fingerprints."""

    discriminator = {"basis": "content", "source": "loader"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="loader")
    loader: str = evidence_field(label="loader", default="")
    pass_: int = evidence_field(label="pass", key="pass", default=0)
    epoch: Optional[int] = evidence_field(keep_none=True)
    dataset_type: str = evidence_field(default="")
    iterable: bool = evidence_field(default=False)
    num_workers: int = evidence_field(default=0)
    indices: str = evidence_field(default="none")  # what the sample positions say (_index_view)
    forward_overlap: Optional[bool] = evidence_field(keep_none=True)
    world_size: int = evidence_field(label="world size", default=0)
    overlap_fraction: float = evidence_field(default=0.0)
    expected_fraction: float = evidence_field(default=0.0)
    num_shared: int = evidence_field(default=0)
    overlap_per_rank: dict[str, float] = evidence_field(default_factory=dict)
    duplicate_rate: dict[str, float] = evidence_field(default_factory=dict)
    rows_compared: dict[str, int] = evidence_field(default_factory=dict)
    sampling_level: int = evidence_field(default=0)
    shared_order_correlation: float = evidence_field(default=ABSENT)  # an IterableDataset's: content.Order
    shared_rows_ordered: int = evidence_field(default=ABSENT)
    order_ranks: list[int] = evidence_field(default=ABSENT)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class RandomDraws(EvidenceRecord, SamplesOverlap):
    """An IterableDataset whose ranks each draw a random sample of one pool: overlap by chance."""

    discriminator = {"basis": "content", "kind": "random-draws"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="loader")
    kind: str = evidence_field(hidden=True, default="random-draws")
    loader: str = evidence_field(label="loader", default="")
    pass_: int = evidence_field(label="pass", key="pass", default=0)
    epoch: Optional[int] = evidence_field(keep_none=True)
    dataset_type: str = evidence_field(default="")
    iterable: bool = evidence_field(default=True)
    num_workers: int = evidence_field(default=0)
    pool_estimate: Optional[int] = evidence_field(keep_none=True)
    overlap_fraction: float = evidence_field(default=0.0)
    expected_fraction: float = evidence_field(default=0.0)
    num_shared: int = evidence_field(default=0)
    overlap_per_rank: dict[str, float] = evidence_field(default_factory=dict)
    duplicate_rate: dict[str, float] = evidence_field(default_factory=dict)
    rows_compared: dict[str, int] = evidence_field(default_factory=dict)
    sampling_level: int = evidence_field(default=0)
    shared_order_correlation: float = evidence_field(default=0.0)
    shared_rows_ordered: int = evidence_field(default=0)
    order_ranks: list[int] = evidence_field(default_factory=list)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class EvaluationOverlap(EvidenceRecord, SamplesOverlap):
    """An evaluation pass every rank fed whole, or with padding duplicates at its tail."""

    discriminator = {"basis": "content", "source": "loader"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="loader")
    loader: str = evidence_field(label="loader", default="")
    pass_: int = evidence_field(label="pass", key="pass", default=0)
    dataset_type: str = evidence_field(default="")
    overlap_fraction: float = evidence_field(default=0.0)
    expected_fraction: float = evidence_field(default=0.0)
    num_shared: int = evidence_field(default=0)
    overlap_per_rank: dict[str, float] = evidence_field(default_factory=dict)
    duplicate_rate: dict[str, float] = evidence_field(default_factory=dict)
    rows_compared: dict[str, int] = evidence_field(default_factory=dict)
    sampling_level: int = evidence_field(default=0)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class ForwardOverlap(EvidenceRecord, SamplesOverlap):
    """A window of DDP forwards whose inputs several ranks fed, by their fingerprints."""

    discriminator = {"basis": "content", "source": "forward"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="forward")
    loader: Optional[str] = evidence_field(label="loader", keep_none=True)
    module: str = evidence_field(default="")
    window: int = evidence_field(default=0)
    forwards_per_rank: dict[str, int] = evidence_field(default_factory=dict)
    world_size: int = evidence_field(label="world size", default=0)
    overlap_fraction: float = evidence_field(default=0.0)
    expected_fraction: float = evidence_field(default=0.0)
    num_shared: int = evidence_field(default=0)
    overlap_per_rank: dict[str, float] = evidence_field(default_factory=dict)
    duplicate_rate: dict[str, float] = evidence_field(default_factory=dict)
    rows_compared: dict[str, int] = evidence_field(default_factory=dict)
    sampling_level: int = evidence_field(default=0)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class SameStep(EvidenceRecord, SamplesOverlap):
    """Identical batches fed to a DDP module at the same training forwards on several ranks."""

    discriminator = {"basis": "content", "kind": "same-step"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="forward")
    kind: str = evidence_field(hidden=True, default="same-step")
    module: str = evidence_field(default="")
    loader: Optional[str] = evidence_field(label="loader", keep_none=True)
    made_in_script: bool = evidence_field(default=False)
    indices: Optional[str] = evidence_field(keep_none=True)
    identical_forwards: int = evidence_field(default=0)
    forwards_compared: int = evidence_field(default=0)
    first_identical_forward: int = evidence_field(default=0)
    trained: bool = evidence_field(default=False)
    also_modules: list[str] = evidence_field(default=ABSENT)  # other DDP modules fed identically (_one_per_job)


@dataclass(frozen=True)
class IdenticalSamples(EvidenceRecord, SamplesOverlap):
    """Identical batches from disjoint positions of one dataset: the dataset's samples are alike."""

    discriminator = {"basis": "content", "kind": "identical-samples"}
    basis: str = evidence_field(hidden=True, default="content")
    source: str = evidence_field(hidden=True, default="forward")
    kind: str = evidence_field(hidden=True, default="identical-samples")
    module: str = evidence_field(default="")
    loader: Optional[str] = evidence_field(label="loader", keep_none=True)
    made_in_script: bool = evidence_field(default=False)
    identical_forwards: int = evidence_field(default=0)
    forwards_compared: int = evidence_field(default=0)
    first_identical_forward: int = evidence_field(default=0)
    indices: str = evidence_field(default="disjoint")
    trained: bool = evidence_field(default=True)
    also_modules: list[str] = evidence_field(default=ABSENT)


# sampler-disjoint's evidence from content, most specific first (a saved report is read back as the first it matches).
OVERLAP_EVIDENCE = (SameStep, IdenticalSamples, RandomDraws, ForwardOverlap, EvaluationOverlap, LoaderOverlap)


@dataclass(frozen=True)
class StreamOrderRepeated(EvidenceRecord, EpochNotSet):
    """An IterableDataset's training passes that repeat the previous pass's samples in the same order."""

    discriminator = {"basis": "content"}
    basis: str = evidence_field(hidden=True, default="content")
    loader: str = evidence_field(label="loader", default="")
    dataset_type: str = evidence_field(default="")
    set_epoch_method: Optional[bool] = evidence_field(keep_none=True)
    dataset_epochs: list[Optional[int]] = evidence_field(default_factory=list)
    declares_shuffle: Optional[bool] = evidence_field(keep_none=True)
    repeated_passes: dict[str, list[list[int]]] = evidence_field(label="same order as an earlier pass",
                                                                 unit="pass-pairs", default_factory=dict)


@derived
def content_streams(evidence: Evidence) -> dict[content.StreamKey, dict[int, Stream]]:
    """(source, key, feeds, number) -> rank -> that rank's sample fingerprints of the pass; loader
    passes (and the loader pass a forward window's batches came from) numbered as paired across ranks."""
    numbers = facts.loaders.pass_numbers(evidence)
    out: dict[content.StreamKey, dict[int, Stream]] = {}
    for (source, key, feeds, number), per_rank in content.merge_streams(evidence.events(ContentPass)).items():
        for rank, stream in per_rank.items():
            if source == "loader":
                number_here, feeds_here = numbers.get((rank, key, number), number), feeds
            else:
                number_here, feeds_here = number, _paired_feed(numbers, rank, feeds)
            out.setdefault((source, key, feeds_here, number_here), {})[rank] = stream
    return out


def _paired_feed(numbers: dict[tuple[int, str, int], int], rank: int, feeds: Optional[str]) -> Optional[str]:
    """A forward window's "loader#raw number" with the loader pass's number as paired across ranks."""
    if not feeds or "#" not in feeds:
        return feeds
    key, _, raw = feeds.rpartition("#")
    try:
        return f"{key}#{numbers.get((rank, key, int(raw)), int(raw))}"
    except ValueError:
        return feeds


def _purpose(events: list, ddp_job: bool) -> str:
    """As sampler-disjoint judges index passes: "training", "local" (fed only a model not trained
    through DDP) or "evaluation"."""
    if any(e.ddp_forwards > 0 for e in events):
        return "training"
    if any(e.steps > 0 for e in events):
        return "local" if ddp_job else "training"
    return "evaluation"


def rank_local(events: Iterable[LoaderPass]) -> bool:
    """Whether the ranks sampled datasets that differ (each built its own: a shard of a file list,
    data generated from the rank): then a position names a different sample on each rank, and only
    the content can tell whether the ranks' samples overlap. Told by the datasets' identity digests
    (type, length, attributes), or, in evidence without them, by the lengths of the datasets under
    every Subset."""
    events = list(events)
    digests = {e.dataset_digest for e in events}
    if None not in digests:
        return len(digests) > 1
    return len({e.base_len for e in events if e.base_len is not None}) > 1


def _indexed(evidence: Evidence, key: str, number: int) -> bool:
    """The index probe saw this pass's sample positions (a map-style dataset with an integer sampler)."""
    passes = facts.loaders.passes(evidence).get((key, number), {})
    return any(e.indices is not None for e in passes.values())


def _rank_local_pass(evidence: Evidence, key: str, number: int) -> bool:
    """This pass's positions index datasets that differ by rank (so the index check left it alone)."""
    return rank_local(facts.loaders.passes(evidence).get((key, number), {}).values())


def _index_view(evidence: Evidence, key: str, number: int) -> str:
    """What the sample positions of this pass say: "none" (no positions: an iterable dataset, a
    sampler of keys), "disjoint" (the ranks drew different positions), "rank-local" (the same
    positions, into datasets that differ by rank) or "overlapping" (the same positions of one
    dataset)."""
    passes = {r: e for r, e in facts.loaders.passes(evidence).get((key, number), {}).items() if e.indices is not None}
    if not passes:
        return "none"
    if not overlap({r: distinct_indices(e.indices) for r, e in passes.items()}).shared.size:
        return "disjoint"
    return "rank-local" if rank_local(passes.values()) else "overlapping"


def _comparable(streams: dict[int, Stream]) -> dict[int, Stream]:
    return {r: s for r, s in streams.items() if s.event.num_rows > 0}


def _forward_confirms(evidence: Evidence, key: str, number: int) -> Optional[bool]:
    """Whether the DDP forwards the pass fed overlap too (None: no forward fed by it on two ranks).
    A script may read the whole stream on every rank and then keep its own slice of each batch."""
    label = content.feed_label(key, number)
    windows = [_comparable(v) for (source, _, feeds, _), v in content_streams(evidence).items()
               if source == "forward" and feeds == label]
    judged = [content.overlap(w) for w in windows if len(w) >= 2]
    judged = [o for o in judged if o.judged]
    if not judged:
        return None
    return any(o.significant for o in judged)


def _iterable_why(event: ContentPass, order: Optional[content.Order], whole_pool: bool) -> str:
    """Why an IterableDataset's ranks overlap: what the stream's order and coverage show."""
    why = "an IterableDataset has no sampler: every rank reads what its __iter__ yields"
    if order is not None and order.aligned:
        why += ", and the ranks read one stream in the same order"
    elif order is not None and whole_pool:
        why += ", and every rank read the whole stream to its end, each in its own order"
    if event.num_workers > 1:
        why += (f"; with num_workers={event.num_workers} sharding by worker alone is not enough, each rank's "
                "workers read the same shards")
    return why


def _loader_finding(check: str, key: str, number: int, streams: dict[int, Stream], result: Overlap, *, view: str,
                    confirmed: Optional[bool], world_size: int, order: Optional[content.Order] = None) -> Finding:
    event = content.first(streams)
    source = f"the training DataLoader over {event.dataset_type}"
    if event.iterable:
        fix = _FIX_ITERABLE
        why = _iterable_why(event, order, content.read_whole_pool(streams, result))
    elif view == "disjoint":
        fix, why = _FIX_ORDER, ("the sampler indices are disjoint, so the ranks hold the dataset in different orders "
                                "(a file list shuffled without a fixed seed, or listed in directory order)")
    elif view == "overlapping":
        fix, why = _FIX_FORWARD, "the sampler drew the same positions on several ranks"
    elif view == "rank-local":
        fix, why = _FIX_RANK_LOCAL, ("each rank built its own dataset (they differ, so a sampler position names a "
                                     "different sample on each rank), and the samples in them overlap")
    else:
        fix, why = _FIX_FORWARD, "the sampler's draws are not sample positions, so only the content shows it"
    pct = f"{100 * result.fraction:.0f}%"
    trained = any(s.event.steps > 0 for s in streams.values())
    verb = "trained on" if trained else "fed to DDP (no optimizer step followed)"
    return Finding(
        check=check, severity="error" if trained else "info", ranks=result.ranks,
        location=Location.from_site(event.site),
        message=(f"{pct} of the samples each rank {verb} in pass {number} of {source} were also fed to "
                 f"another rank (chance would give {100 * result.expected:.1f}%): {why}"),
        fix=fix,
        evidence=LoaderOverlap(loader=key, pass_=number, epoch=event.epoch, dataset_type=event.dataset_type,
                               iterable=event.iterable, num_workers=event.num_workers, indices=view,
                               forward_overlap=confirmed, world_size=world_size, **result.as_evidence(),
                               **(order.as_evidence() if order is not None else {})))


def _random_draws_finding(check: str, key: str, number: int, streams: dict[int, Stream], result: Overlap,
                          order: content.Order) -> Finding:
    """Info: an IterableDataset whose ranks share rows in unrelated orders, without reading the whole
    stream: each rank draws its own random sample from one pool (a stream shuffled with a seed that
    depends on the rank), so the ranks meet as often as random draws of that size do. Sampling, as
    nanoGPT's get_batch does, not a partition: nothing proves a bug."""
    event = content.first(streams)
    pool = content.pool_size(streams, result)
    pct = f"{100 * result.fraction:.0f}%"
    return Finding(
        check=check, severity="info", ranks=result.ranks, location=Location.from_site(event.site),
        message=(f"{pct} of the samples each rank trained on in pass {number} of the training DataLoader over "
                 f"{event.dataset_type} (an IterableDataset) were also fed to another rank, in unrelated orders: "
                 "each rank draws its own random sample from one pool"
                 + (f" of about {pool} samples" if pool else "")
                 + ", which overlap this much by chance; random sampling, not a partition of the data"),
        fix=("Nothing to do if each rank is meant to sample at random (seeded by rank). For disjoint shards, keep "
             "every (world_size * num_workers)-th sample in `__iter__`, starting at rank * num_workers + worker_id."),
        evidence=RandomDraws(loader=key, pass_=number, epoch=event.epoch, dataset_type=event.dataset_type,
                             num_workers=event.num_workers, pool_estimate=pool, **result.as_evidence(),
                             **order.as_evidence()))


def _eval_finding(check: str, key: str, number: int, streams: dict[int, Stream], result: Overlap) -> Optional[Finding]:
    """An evaluation pass without indices: every rank evaluated everything (info), or padding
    duplicates at the tail that summed metrics count twice (warning)."""
    event = content.first(streams)
    location = Location.from_site(event.site)
    base = EvaluationOverlap(loader=key, pass_=number, dataset_type=event.dataset_type, **result.as_evidence())
    if result.judged and min(result.per_rank.values()) >= 0.9:
        return Finding(check=check, severity="info", ranks=result.ranks, location=location, evidence=base,
                       message=(f"every rank fed the same samples through the evaluation DataLoader over "
                                f"{event.dataset_type} (pass {number}): the evaluation is repeated on each rank "
                                "rather than sharded"),
                       fix="Shard evaluation by rank and all_reduce the metric sums, or evaluate on rank 0 only.")
    if content.looks_like_padding(streams, result):
        return Finding(check=check, severity="warning", ranks=result.ranks, location=location, evidence=base,
                       message=(f"{result.num_shared} samples of the evaluation DataLoader over {event.dataset_type} "
                                f"were fed on two ranks at the end of pass {number} (padding duplicates): metrics "
                                "summed across ranks count them twice"),
                       fix=("Do not pad the evaluation shards: let the last rank(s) have fewer samples and sum the "
                            "counts with all_reduce."))
    return None


def _forward_finding(check: str, key: str, number: int, streams: dict[int, Stream], result: Overlap,
                     world_size: int) -> Finding:
    trained = any(s.event.steps > 0 for s in streams.values())
    event = content.first(streams)
    return Finding(
        check=check, severity="error" if trained else "info", ranks=result.ranks,
        location=Location.from_site(event.site),
        message=(f"{100 * result.fraction:.0f}% of the samples each rank fed to DDP ({key}, forward input, window "
                 f"{number}) were also fed to another rank (chance would give {100 * result.expected:.1f}%): "
                 + ("the ranks train on the same batches" if trained
                    else "no optimizer step followed, so nothing was trained on them (a test or a benchmark?)")),
        fix=_FIX_FORWARD if trained else "Nothing to do if every rank is meant to see the same input.",
        evidence=ForwardOverlap(module=key, window=number,
                                forwards_per_rank={str(r): s.event.num_batches for r, s in sorted(streams.items())},
                                world_size=world_size, **result.as_evidence()))


def _same_step_findings(check: str, evidence: Evidence) -> dict[str, Finding]:
    """DDP module -> a finding when ranks fed it identical batches at the same training forward:
    the same batch at the same step, whatever produced it (a hand-written loader given the same
    offset on every rank, the same seed everywhere), however few rows a batch has."""
    digests: dict[str, dict[int, dict[int, str]]] = {}  # module -> rank -> forward -> digest
    windows: dict[str, list] = {}
    for rank, event in evidence.events(ContentPass):
        if event.source != "forward" or event.first_forward is None:
            continue
        per_rank = digests.setdefault(event.key, {}).setdefault(rank, {})
        for i, digest in enumerate(event.digests):
            per_rank[event.first_forward + i] = digest
        windows.setdefault(event.key, []).append((rank, event))
    found: dict[str, Finding] = {}
    for key, per_rank in sorted(digests.items()):
        if len(per_rank) < 2:
            continue
        common = sorted(set.intersection(*(set(d) for d in per_rank.values())))
        same: list[int] = []
        ranks: set[int] = set()
        for forward in common:
            holders: dict[str, list[int]] = {}
            for rank, d in per_rank.items():
                holders.setdefault(d[forward], []).append(rank)
            shared = [r for group in holders.values() if len(group) > 1 for r in group]
            if shared:
                same.append(forward)
                ranks.update(shared)
        if len(same) < MIN_SAME_FORWARDS or len(same) < SAME_FRACTION * len(common):
            continue
        involved = [e for r, e in windows[key] if r in ranks]
        trained = any(e.steps > 0 for e in involved)
        site = next((e.site for e in involved if e.site), [])
        feeds = next((e.feeds for e in involved if e.feeds), None)
        loader = feeds.rpartition("#")[0] if feeds else None
        made = all(per_rank[r][f].startswith("s:") for f in same for r in ranks if f in per_rank[r])
        disjoint = not made and _feeding_disjoint(evidence, involved)
        if disjoint and trained and _rows_repeat(evidence, involved, ranks):
            found[key] = _identical_samples_finding(check, key, loader, site, same, len(common), ranks)
            continue
        what = "inputs" if made else "batches"
        if made and loader:
            source = (f"; the script made them (they are not the batches of the DataLoader at "
                      f"{loader.rsplit('/', 1)[-1]} that fed the loop)")
        elif made:
            source = "; they did not come from a DataLoader"
        else:
            source = f"; the batches came from the DataLoader at {loader.rsplit('/', 1)[-1]}" + (
                ", although its sampler gave the ranks disjoint positions of one dataset: the dataset's items do "
                "not follow the index they are asked for" if disjoint else "")
        found[key] = Finding(
            check=check, severity="error" if trained else "info", ranks=tuple(sorted(ranks)),
            location=Location.from_site(site),
            message=(f"ranks {', '.join(map(str, sorted(ranks)))} fed identical {what} to DDP at {len(same)} of "
                     f"{len(common)} training forwards (the same {'input' if made else 'batch'} at the same step)"
                     + (": every rank trains on the same data, so the job does one rank's work N times" if trained
                        else ", but no optimizer step followed, so nothing was trained on them (a test or a "
                             "benchmark?)") + source),
            fix=(_FIX_MADE if made and loader else _FIX_INDEX if disjoint else _FIX_FORWARD) if trained
            else "Nothing to do if every rank is meant to see the same input.",
            evidence=SameStep(module=key, loader=None if made else loader, made_in_script=made,
                              indices="disjoint" if disjoint else None, identical_forwards=len(same),
                              forwards_compared=len(common), first_identical_forward=same[0], trained=trained))
    return _one_per_job(found)


def _feeding_disjoint(evidence: Evidence, involved: list) -> bool:
    """Every loader pass that fed these forward windows gave the ranks disjoint positions of one
    dataset: the ranks drew different samples, so identical batches are not the sampler's doing."""
    feeds = {e.feeds for e in involved}
    if not feeds or None in feeds:
        return False
    for label in feeds:
        loader, _, number = label.rpartition("#")
        if _index_view(evidence, loader, int(number)) != "disjoint" or _rank_local_pass(evidence, loader, int(number)):
            return False
    return True


def _rows_repeat(evidence: Evidence, involved: list, ranks: set[int]) -> bool:
    """Within each loader pass that fed these windows, each rank's rows repeat each other although it
    drew each position once (a pass is one epoch of its shard): different positions hold the same
    sample, as in a synthetic dataset that gives one blank image for every index. Rows seen again in
    a later epoch do not count, nor does a dataset that ignores the index it is asked for and yields
    the same sequence on every rank: within a pass it repeats nothing."""
    for label in {e.feeds for e in involved}:
        loader, _, number = label.rpartition("#")
        streams = content_streams(evidence).get(("loader", loader, None, int(number)), {})
        passes = facts.loaders.passes(evidence).get((loader, int(number)), {})
        for rank in ranks:
            stream, drawn = streams.get(rank), passes.get(rank)
            if stream is None or drawn is None or drawn.indices is None or not stream.hashes:
                return False
            if distinct_indices(drawn.indices).size < IDENTICAL_ROWS * (drawn.num_samples or 0):
                return False  # the rank drew positions again: repeats of its rows prove nothing
            if 1 - len(set(stream.hashes)) / len(stream.hashes) < IDENTICAL_ROWS:
                return False
    return True


def _identical_samples_finding(check: str, key: str, loader: Optional[str], site: list, same: list[int],
                               num_common: int, ranks: set[int]) -> Finding:
    num_same = len(same)
    where = f"the DataLoader at {loader.rsplit('/', 1)[-1]}" if loader else "the DataLoader"
    return Finding(
        check=check, severity="info", ranks=tuple(sorted(ranks)), location=Location.from_site(site),
        message=(f"ranks {', '.join(map(str, sorted(ranks)))} fed identical batches to DDP at {num_same} of "
                 f"{num_common} training forwards, but {where} gave them disjoint samples of one dataset: the "
                 "dataset holds identical samples (a synthetic or constant dataset?), not a sharding bug"),
        fix="Nothing to do for a smoke test on synthetic data; real data will differ by sample.",
        evidence=IdenticalSamples(module=key, loader=loader, identical_forwards=num_same,
                                  forwards_compared=num_common, first_identical_forward=same[0]))


def _one_per_job(found: dict[str, Finding]) -> dict[str, Finding]:
    """Identical inputs to several DDP modules are one cause seen several times (a GAN's critic is fed
    the generator's identical output): the first module's finding, naming the others, for every key."""
    if len(found) < 2:
        return found
    keys = sorted(found, key=lambda k: (found[k].severity != "error", found[k].evidence.first_identical_forward, k))
    first, others = found[keys[0]], [found[k] for k in keys[1:]]
    head = dataclasses.replace(
        first, ranks=tuple(sorted({r for f in found.values() for r in f.ranks})),
        message=first.message + "; identical at the same steps too: " + ", ".join(
            f"DDP module {f.evidence.module}" + (f" (line {f.location.line})" if f.location and f.location.line
                                                  else "") for f in others),
        evidence=dataclasses.replace(first.evidence, also_modules=[f.evidence.module for f in others]))
    return {k: head for k in found}


def overlap_findings(check: str, evidence: Evidence) -> tuple[list[Finding], int]:
    """sampler-disjoint's findings (``check``: its id) from content, one per loader or DDP module: its
    first affected pass, with the count; and the number of passes compared."""
    ddp_job = bool(facts.ddp.wraps(evidence))
    same_step = _same_step_findings(check, evidence)
    first: dict[tuple, Finding] = {}
    affected: Counter = Counter()
    num_compared = 0
    for (source, key, feeds, number), streams in sorted(content_streams(evidence).items(),
                                                         key=lambda kv: (kv[0][3], str(kv[0]))):
        streams = _comparable(streams)
        if len(streams) < 2 or (source == "forward" and feeds is not None):
            continue  # windows a loader fed only confirm that loader's overlap
        result = content.overlap(streams)
        num_compared += result.judged
        finding = None
        if source == "forward":
            if result.significant and key not in same_step:
                finding = _forward_finding(check, key, number, streams, result, evidence.world_size)
        else:
            purpose = _purpose([s.event for s in streams.values()], ddp_job)
            if purpose == "training" and result.significant and not content.looks_like_padding(streams, result):
                confirmed = _forward_confirms(evidence, key, number)
                if confirmed is not False:
                    view = _index_view(evidence, key, number)
                    order = content.shared_order(streams, result.level) if content.first(streams).iterable else None
                    if order is not None and not order.aligned and not content.read_whole_pool(streams, result):
                        finding = _random_draws_finding(check, key, number, streams, result, order)
                    else:
                        finding = _loader_finding(check, key, number, streams, result, view=view, confirmed=confirmed,
                                                  world_size=evidence.world_size, order=order)
            elif (purpose == "evaluation" and result.shared
                  and (not _indexed(evidence, key, number) or _rank_local_pass(evidence, key, number))):
                finding = _eval_finding(check, key, number, streams, result)
        if finding is not None:
            slot = (source, key, finding.severity)
            affected[slot] += 1
            first.setdefault(slot, finding)
    counted = [dataclasses.replace(f, evidence=dataclasses.replace(f.evidence, num_passes_affected=affected[slot]))
               for slot, f in first.items()]
    loaders = {f.evidence.loader for f in counted if f.evidence.source == "loader"}
    extra = list({id(f): f for f in same_step.values()
                  if f.evidence.loader is None or f.evidence.loader not in loaders}.values())
    return counted + extra, num_compared + len(same_step)


def repeated_order_findings(check: str, evidence: Evidence) -> list[Finding]:
    """set-epoch's findings (``check``: its id) from content: an IterableDataset's training passes
    that repeat the previous pass's samples in the same order. A warning where the dataset shows it
    means to reshuffle (it defines set_epoch but its epoch never moved, or it says it shuffles); a
    fixed order may be intended otherwise (a stream in its natural order): info."""
    ddp_job = bool(facts.ddp.wraps(evidence))
    per_loader: dict[str, dict[int, list[Stream]]] = {}
    for (source, key, _, _), streams in content_streams(evidence).items():
        if source != "loader":
            continue
        for rank, stream in streams.items():
            if stream.event.iterable and _purpose([stream.event], ddp_job) == "training":
                per_loader.setdefault(key, {}).setdefault(rank, []).append(stream)
    findings = []
    for key, ranks in sorted(per_loader.items()):
        repeats = {r: content.repeated_orders(passes) for r, passes in ranks.items()}
        stale = sorted(r for r, found in repeats.items() if found)
        if not stale:
            continue
        passes = sorted(ranks[stale[0]], key=lambda s: s.event.number)
        event = passes[0].event
        pairs = repeats[stale[0]]
        epochs = [s.event.dataset_epoch for s in passes]
        never_set = bool(event.set_epoch_method) and None not in epochs and len(set(epochs)) == 1
        intent = never_set or bool(event.declares_shuffle)
        what = (f"the training DataLoader over {event.dataset_type} (an IterableDataset) fed the same samples in "
                f"the same order in pass {pairs[0][0]} as in pass {pairs[0][1]}")
        if never_set:
            message = (f"{what}: {event.dataset_type} defines set_epoch() but its epoch stayed {epochs[0]}: "
                       "set_epoch is never called, so the stream is never reshuffled")
            fix = ("Call `dataset.set_epoch(epoch)` at the start of every epoch, before iterating the DataLoader "
                   "(as with DistributedSampler).")
        elif intent:
            message = f"{what}: {event.dataset_type} shuffles, but with the same permutation every epoch"
            fix = ("Seed the shuffle with a value that is the same on every rank and changes with the epoch "
                   "(`random.Random(seed + epoch)`), e.g. through a `set_epoch(epoch)` method called every epoch.")
        else:
            message = (f"{what}: the stream is not reshuffled between epochs, which is fine if its fixed order is "
                       "intended")
            fix = ("Nothing to do for a fixed order. To reshuffle, give the dataset a `set_epoch(epoch)` method (as "
                   "DistributedSampler has) that shuffles its shard list with `random.Random(seed + epoch)`, and "
                   "call it before each epoch.")
        findings.append(Finding(
            check=check, severity="warning" if intent else "info", ranks=tuple(stale),
            location=Location.from_site(event.site), message=message, fix=fix,
            evidence=StreamOrderRepeated(loader=key, dataset_type=event.dataset_type,
                                         set_epoch_method=event.set_epoch_method, dataset_epochs=epochs,
                                         declares_shuffle=event.declares_shuffle,
                                         repeated_passes={str(r): [list(p) for p in repeats[r]] for r in stale})))
    return findings
