"""sampler-disjoint: per epoch and loader, each sample goes to exactly one rank."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.index_sets import Overlap, distinct_indices, overlap, repeat_count
from ddpdoctor.analysis.symptoms import SamplesOverlap
from ddpdoctor.schema.events import LoaderPass, SamplerInfo
from ddpdoctor.schema.findings import ABSENT

from ._common import fmt_ranks
from ._content import OVERLAP_EVIDENCE, overlap_findings, rank_local

ID = "sampler-disjoint"

DOCS = """\
## What it does
Records which sample indices each rank drew from every DataLoader in every pass (epoch), from the
sampler or batch sampler, with any number of workers, and compares the ranks' sets:

- **overlap**: samples seen by more than one rank (DataLoader with `shuffle=True` and no
  `DistributedSampler`, samplers seeded differently per rank, wrong `num_replicas`/`rank`);
- **never seen**: samples no rank drew (e.g. `num_replicas` larger than the world size);
- **padding duplicates**: `DistributedSampler` (or any sampler that evens out the last batches by
  wrapping around, like Accelerate's `even_batches`, even when the copy is a whole batch) repeats a
  few samples so every rank gets the same count. Harmless for training, reported as info; in an
  evaluation loader they are counted twice in your metrics, reported as a warning.

The sampler named is the one that draws, under the batch samplers that wrap it (Accelerate's
`BatchSamplerShard` around the loader's `RandomSampler`). Samples never drawn are counted against
what that sampler covers: a `DistributedSampler`'s dataset (under Lightning's
`DistributedSamplerWrapper`, the wrapped sampler: a k-fold `SubsetRandomSampler(train_ids)` covers
its fold, not the dataset), a `SubsetRandomSampler`'s indices. A custom sampler's coverage is
unknown, so nothing is said about samples it never drew.

A custom sampler that knows the ranks (its `num_replicas` is the world size and its `rank` each
rank's own), draws a different slice on each rank and draws nearly every sample the same number of
times in all repeats samples on purpose (repeated augmentation: DeiT's `RASampler`, timm's
`RepeatAugSampler`): info naming the repetition. A `DistributedSampler` with the wrong
`num_replicas`/`rank`, or a custom sampler whose slices overlap at random (shuffled with a seed that
depends on the rank), stays an error.

Where indices cannot tell (an `IterableDataset` or streaming pipeline with no sampler, a dataset
each rank builds in its own order behind a non-shuffling `DistributedSampler`, hand-written
batching with no DataLoader), it compares the **content**: a fingerprint of every row of every
batch a DataLoader yields and of every batch entering a DDP training forward. A training pass in
which a large share of one rank's samples were also fed to another rank, far more than chance
and the data's own duplicates explain, is an error naming the DataLoader and its dataset class
(or "forward input") and the fix for the pattern: shard the stream by rank and worker, sort or
seed the file list, use `DistributedSampler`. When the indices already show the overlap, the
content finding is listed as its consequence.

An `IterableDataset` may sample at random on purpose, each rank with its own seed (llama2.c's
`PretokDataset`: `seed = 42 + worker_id + 1337 * rank`), as nanoGPT's `get_batch` does: ranks that
draw from one pool at the same time share about the fraction of the pool each has read. The order
tells it from a stream read alike: rows two ranks share come in the same order when the ranks read
one stream (an error), in unrelated orders when each draws its own sample (info: random sampling,
not a partition), unless every rank read its whole stream to the end (every rank saw all the data
that epoch: an error). Identical batches at the same step on several ranks are an error, unless the
DataLoader that fed them gave the ranks disjoint positions of one dataset and each rank's own
samples repeat each other: then the data holds identical samples (a synthetic dataset with one
blank image for every index), reported as info. Disjoint positions with identical batches and no
repeats within a rank mean a dataset whose items do not follow their index: an error.

Indices mean the same sample only when the ranks share one dataset. A dataset each rank builds
for itself (each rank's slice `files[rank::world_size]` of a file list, as openai/improved-diffusion's
loader does, or data generated from the rank) holds different samples behind the same positions:
the ranks' datasets are told apart by a digest of what each holds (its type, length and attributes:
file lists, arrays, tensors, sampled, never its items), and such passes are judged by content only,
never by index (both ranks drawing positions 0-7 of their own shards is no overlap).

Coverage is judged against the dataset the sampler samples (a `Subset` from `random_split`
included). A loader that feeds only a model not trained through DDP (a rank-local reference copy)
is not a sharding error; a loader only one rank reads (batches broadcast to the others, as
Accelerate's `dispatch_batches` does) is not compared.

## Why it matters
With overlapping shards each step averages gradients of the same samples N times: an N-GPU epoch
is worth one GPU's epoch and the effective data is 1/N of what you think. Unseen samples silently
shrink the dataset.

## Example
```python
loader = DataLoader(dataset, batch_size=64, shuffle=True)   # every rank draws from all samples
```

## Use instead
```python
sampler = DistributedSampler(dataset)                        # same seed on every rank
loader = DataLoader(dataset, batch_size=64, sampler=sampler)
```
"""


# Info findings of samples several ranks fed that are no sharding bug: random draws per rank,
# repetition by design, a dataset of identical samples.
_NOT_A_BUG = ("random-draws", "repetition", "identical-samples")


@dataclass(frozen=True)
class _IndexPass(EvidenceRecord, SamplesOverlap):
    """One loader pass as the sampler indices show it: what every index finding starts with."""

    basis: ClassVar[str] = "indices"  # not written: a finding without a basis is about the indices
    loader: str = evidence_field(label="loader", default="")
    pass_: int = evidence_field(label="pass", key="pass", default=0)
    sampler: Optional[str] = evidence_field(keep_none=True)
    batch_sampler: Optional[str] = evidence_field(keep_none=True)
    dataset_len: Optional[int] = evidence_field(keep_none=True)
    population: Optional[int] = evidence_field(keep_none=True)
    samples_per_rank: dict[str, Optional[int]] = evidence_field(default_factory=dict)
    epoch: Optional[int] = evidence_field(keep_none=True)


@dataclass(frozen=True)
class Repetition(_IndexPass):
    """A sampler that knows the ranks draws every sample several times on purpose (repeated augmentation)."""

    discriminator = {"kind": "repetition"}
    kind: str = evidence_field(hidden=True, default="repetition")
    num_shared: int = evidence_field(default=0)
    repeats: int = evidence_field(default=0)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class SharedSamples(_IndexPass):
    """Samples drawn by more than one rank in one pass."""

    num_shared: int = evidence_field(default=0)
    shared_examples: list[int] = evidence_field(default_factory=list)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class PaddingDuplicates(_IndexPass):
    """The sampler's padding: a few samples repeated so that every rank gets the same count."""

    num_padding_duplicates: int = evidence_field(label="padding duplicates", default=0)
    padding_examples: list[int] = evidence_field(label="examples", default_factory=list)
    num_passes_affected: int = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class UnseenSamples(_IndexPass):
    """Samples of the population no rank drew in a complete pass."""

    num_unseen: int = evidence_field(label="samples no rank drew", default=0)
    expected_unseen: int = evidence_field(label="expected", default=0)
    sampler_num_replicas: Optional[int] = evidence_field(label="sampler num_replicas", keep_none=True)
    world_size: int = evidence_field(label="world size", default=0)
    num_passes_affected: int = evidence_field(default=ABSENT)


_INDEX_EVIDENCE = (Repetition, SharedSamples, PaddingDuplicates, UnseenSamples)


def _index_overlap(finding: Finding) -> bool:
    """An overlap (or a gap) the sampler indices show, worth a warning or an error."""
    return finding.severity in ("error", "warning") and isinstance(finding.evidence, _INDEX_EVIDENCE)


def _same_overlap_by_content(symptom: Finding, cause: Finding) -> bool:
    """The samples' fingerprints show the overlap the sampler indices already showed (same loader)."""
    seen = symptom.evidence
    return (isinstance(seen, SamplesOverlap) and seen.basis == "content"
            and (seen.loader == cause.evidence.loader or seen.source == "forward"))


EXPLAINS = (
    # Overlapping sampler indices: the overlapping sample content is the same bug, seen again.
    Explains("index overlap seen in content", _same_overlap_by_content, cause=_index_overlap, priority=130),
)


def _expected_padding(sampler: SamplerInfo, population: int) -> int:
    if sampler.distributed and not sampler.drop_last and sampler.total_size:
        return max(0, sampler.total_size - population)
    return 0


def _expected_unseen(sampler: SamplerInfo, loader_drop_last: bool, batch_size: Optional[int], population: int,
                     world_size: int) -> int:
    allowed = 0
    if sampler.distributed and sampler.drop_last and sampler.num_samples:
        allowed += max(0, population - sampler.num_samples * world_size)
    if loader_drop_last and batch_size:
        allowed += world_size * (batch_size - 1)
    return allowed


def _is_wraparound(events: dict[int, LoaderPass], drawn_sets: Overlap, world_size: int) -> bool:
    """Padding by wrap-around, as any sampler that evens out the last batches does (DistributedSampler,
    Accelerate's even_batches): a few extra draws, each in the last batch of some rank and repeating
    a sample from the first batch of some rank. Only complete passes reached their last batches: in
    a pass cut short after its first batch (a crash), that batch is both first and last, and any
    sample two ranks happened to draw would look like padding."""
    if not all(e.complete for e in events.values()):
        return False
    drawn, union = drawn_sets.drawn, drawn_sets.union
    batch = max(e.batch_size or -(-(e.num_samples or 0) // max(e.num_batches, 1)) or 1 for e in events.values())
    extra = drawn - union
    if extra <= 0 or extra > world_size * batch or 2 * extra >= union:
        return False
    firsts = {i for e in events.values() for i in e.head[:batch]}
    lasts = {i for e in events.values() for i in e.tail[-batch:]}
    return all(i in firsts and i in lasts for i in drawn_sets.shared.tolist())


def _sampler_name(sampler: SamplerInfo) -> str:
    """The sampler that drew, and the batch sampler around it where that one is not the plain
    BatchSampler (Accelerate's BatchSamplerShard shards and pads the batches of the loader's own)."""
    if sampler.batch_sampler in (None, "BatchSampler", sampler.type):
        return sampler.type
    return f"{sampler.type} under {sampler.batch_sampler}"


def _deliberate_repeats(events: dict[int, LoaderPass], world_size: int) -> Optional[int]:
    """How many times a sampler that knows the ranks draws each sample across them on purpose
    (repeated augmentation: DeiT's RASampler, timm's RepeatAugSampler), or None. Deliberate when it
    is not a DistributedSampler (whose repeats are padding or a misconfiguration), every rank's
    sampler carries the process group's world size and that rank's own rank, every rank drew a
    different multiset (a slice that depends on the rank), and nearly every sample drawn was drawn
    the same number of times, at least twice, in all. A sampler seeded by the rank overlaps at
    random: some samples on one rank, some on two, some on none."""
    if len(events) != world_size or any(e.sampler.distributed or e.indices is None for e in events.values()):
        return None
    if any(e.sampler.num_replicas != world_size or e.sampler.rank != r for r, e in events.items()):
        return None
    return repeat_count({r: e.indices for r, e in events.items()})


def _repetition_finding(key: tuple[str, int], events: dict[int, LoaderPass], repeats: int, shared: int,
                        population: Optional[int], base: dict[str, Any], ranks: tuple[int, ...]) -> Finding:
    sampler = events[min(events)].sampler
    return Finding(
        check=ID, severity="info", ranks=ranks, location=Location.from_site(events[min(events)].site),
        evidence=Repetition(**base, num_shared=shared, repeats=repeats),
        message=(f"{sampler.type} draws every sample {repeats} times across the {len(events)} ranks on purpose "
                 f"(repeated augmentation): it knows the ranks (num_replicas={sampler.num_replicas} and each "
                 f"rank's own rank), so {shared} of {population} samples of the training DataLoader were drawn by "
                 f"more than one rank in pass {key[1]}"),
        fix=("Nothing to do if the repetition is intended (each copy is augmented differently). If the sampler is "
             "not meant to repeat samples, its ranks' slices overlap: give rank r the positions r, r + num_replicas, "
             "r + 2 * num_replicas, ... of one permutation that every rank draws alike."))


def _fix_for(sampler: SamplerInfo, world_size: int) -> str:
    if not sampler.distributed and sampler.rank is not None and sampler.num_replicas == world_size:
        return (f"{sampler.type} knows the ranks, yet their draws overlap: shuffle with a seed that is the same on "
                "every rank (seed + epoch, never the rank) before taking the rank's slice, or use "
                "`DistributedSampler(dataset)` and `sampler.set_epoch(epoch)`.")
    if not sampler.distributed:
        return ("Give the training DataLoader a `DistributedSampler(dataset)` (sampler=..., and no shuffle=True on "
                "the loader), and call `sampler.set_epoch(epoch)` every epoch.")
    if sampler.num_replicas not in (None, world_size):
        return (f"Leave `num_replicas` and `rank` at their defaults (the process group's world size {world_size} "
                "and rank), or pass dist.get_world_size() and dist.get_rank().")
    return ("Use the same `seed` on every rank: `DistributedSampler(dataset, seed=SEED)` with SEED not depending on "
            "the rank.")


def _purpose(events: dict[int, LoaderPass], ddp_job: bool) -> str:
    """"training" when the pass fed DDP training forwards (or, in a job without DDP, optimizer steps),
    "local" when it fed only a model not trained through DDP, else "evaluation"."""
    if any(e.ddp_forwards > 0 for e in events.values()):
        return "training"
    if any(e.steps > 0 for e in events.values()):
        return "local" if ddp_job else "training"
    return "evaluation"


def _analyze_pass(key: tuple[str, int], events: dict[int, LoaderPass], world_size: int, *,
                  ddp_job: bool) -> Optional[Finding]:
    any_event = events[min(events)]
    purpose = _purpose(events, ddp_job)
    if purpose == "local":  # a rank-local model (a reference copy, a probe): sharding is not DDP's concern
        return None
    dataset_len = any_event.dataset_len
    sampler = any_event.sampler
    is_train = purpose == "training"
    per_rank = {r: distinct_indices(e.indices) for r, e in events.items() if e.indices is not None}
    if len(per_rank) < 2:
        return None
    drawn_sets = overlap(per_rank)
    shared = drawn_sets.shared
    location = Location.from_site(any_event.site)
    loader_name = f"the {'training' if is_train else 'evaluation'} DataLoader"
    base: dict[str, Any] = dict(  # the fields of _IndexPass
        loader=key[0], pass_=key[1], sampler=sampler.type, batch_sampler=sampler.batch_sampler, dataset_len=dataset_len,
        population=sampler.population, samples_per_rank={str(r): e.num_samples for r, e in sorted(events.items())},
        epoch=sampler.epoch)
    ranks = tuple(sorted(per_rank))
    # What the sampler draws from: a sampler over a fold of the dataset covers the fold only.
    population = sampler.population if sampler.population is not None else dataset_len
    padding = _expected_padding(sampler, population or 0)
    wraparound = len(shared) > padding and _is_wraparound(events, drawn_sets, world_size)
    if len(shared) > padding and not wraparound:
        everyone_everything = all(size == drawn_sets.union for size in drawn_sets.sizes.values())
        repeats = _deliberate_repeats(events, world_size) if is_train else None
        if repeats is not None:
            return _repetition_finding(key, events, repeats, len(shared), population, base, ranks)
        evidence = SharedSamples(**base, num_shared=len(shared), shared_examples=shared[:10].tolist())
        if not is_train and everyone_everything:
            return Finding(check=ID, severity="info", ranks=ranks, location=location, evidence=evidence,
                           message=(f"every rank iterated all {drawn_sets.union} samples of {loader_name} "
                                    f"(pass {key[1]}): the evaluation is repeated on each rank rather than sharded"),
                           fix="Shard evaluation with DistributedSampler(dataset, shuffle=False) and all_reduce the "
                               "metric sums, or evaluate on rank 0 only.")
        severity = "error" if is_train else "warning"
        return Finding(check=ID, severity=severity, ranks=ranks, location=location, evidence=evidence,
                       message=(f"{len(shared)} of {population} samples of {loader_name} were drawn by more than one "
                                f"rank in pass {key[1]} (sampler {_sampler_name(sampler)})"),
                       fix=_fix_for(sampler, world_size))
    if len(shared):
        evidence = PaddingDuplicates(**base, num_padding_duplicates=len(shared), padding_examples=shared[:10].tolist())
        who = ("DistributedSampler" if sampler.distributed and not wraparound
               else f"the sampler ({_sampler_name(sampler)})")
        if is_train:
            return Finding(check=ID, severity="info", ranks=ranks, location=location, evidence=evidence,
                           message=(f"{who} padded {loader_name} with {len(shared)} repeated samples so "
                                    f"every rank gets the same count ({population} samples on {world_size} ranks)"),
                           fix="Nothing to do for training; drop_last=True on the sampler avoids the repeats.")
        return Finding(check=ID, severity="warning", ranks=ranks, location=location, evidence=evidence,
                       message=(f"{who} padded {loader_name} with {len(shared)} repeated samples: metrics "
                                "summed across ranks count them twice"),
                       fix=("Evaluate with a sampler that does not pad (e.g. split indices by hand with "
                            "torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size))) and sum the "
                            "counts with all_reduce, or make the dataset size a multiple of the world size."))
    same_domain = len({e.domain for e in events.values()}) == 1
    complete = all(e.complete for e in events.values()) and len(events) == world_size
    known = {e.sampler.population for e in events.values()}
    # Samples never drawn count only against a population the samplers state, the same on every rank
    # (a custom sampler's is unknown: it may leave samples out by design).
    if complete and same_domain and len(known) == 1 and None not in known and population:
        unseen = population - drawn_sets.union
        allowed = _expected_unseen(sampler, any_event.drop_last, any_event.batch_size, population, world_size)
        # a resumed epoch: the batches trained before the checkpoint are skipped, never drawn
        allowed += sum(e.skipped_batches * (e.batch_size or 1) for e in events.values())
        if unseen > allowed:
            severity = "error" if unseen > population // 4 else "warning"
            return Finding(check=ID, severity=severity, ranks=ranks, location=location,
                           evidence=UnseenSamples(**base, num_unseen=unseen, expected_unseen=allowed,
                                                  sampler_num_replicas=sampler.num_replicas, world_size=world_size),
                           message=(f"{unseen} of {population} samples of {loader_name} were drawn by no rank in "
                                    f"pass {key[1]}"),
                           fix=_fix_for(sampler, world_size))
    return None


def _index_findings(evidence: Evidence) -> tuple[list[Finding], dict, int]:
    """Findings from the sampler indices (one per loader and severity), the passes compared, and
    the number of passes over datasets each rank built for itself (left to the content)."""
    comparable = {k: {r: e for r, e in v.items() if e.num_batches > 0}
                  for k, v in facts.loaders.passes(evidence).items()}
    comparable = {k: v for k, v in comparable.items() if len(v) >= 2}
    # Positions into datasets that differ by rank name different samples: only the content can tell.
    local = {k for k, v in comparable.items() if rank_local(v.values())}
    comparable = {k: v for k, v in comparable.items() if k not in local}
    ddp_job = bool(facts.ddp.wraps(evidence))
    first_per_loader: dict[tuple[str, str], Finding] = {}
    affected: Counter = Counter()
    for key in sorted(comparable, key=lambda k: (k[1], k[0])):
        finding = _analyze_pass(key, comparable[key], evidence.world_size, ddp_job=ddp_job)
        if finding is None:
            continue
        slot = (key[0], finding.severity)
        affected[slot] += 1
        first_per_loader.setdefault(slot, finding)
    findings = []
    for slot, finding in first_per_loader.items():
        counted = dataclasses.replace(finding.evidence, num_passes_affected=affected[slot])
        findings.append(dataclasses.replace(finding, evidence=counted))
    return findings, comparable, len(local)


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    findings, comparable, num_local = _index_findings(evidence)
    content_findings, num_content = overlap_findings(ID, evidence)
    findings += content_findings
    if not comparable and not num_content and not findings:
        return CheckResult(summary="no DataLoader pass seen on two ranks" if not num_local else
                           f"{num_local} passes over datasets each rank built itself, too few samples to compare by "
                           "content", applicable=False)
    loaders = {k[0] for k in comparable}
    clean = (f"{len(comparable)} passes over {len(loaders)} loader(s): shards disjoint" if comparable
             else f"{num_content} passes compared by content: no overlap")
    if num_local:
        clean += f" ({num_local} of them over datasets each rank built itself)"
    if not findings:
        return CheckResult(summary=clean)
    worst = [f for f in findings if f.severity != "info"]
    notes = [f for f in findings if getattr(f.evidence, "kind", None) in _NOT_A_BUG]
    if notes and not worst:  # shared samples that are no sharding bug, explained in the findings
        clean = f"{len(comparable) + num_content} passes compared: no sharding bug ({len(notes)} explained overlap(s))"
    summary = (f"overlapping or missing samples in {len(worst)} loader(s)" if worst else clean)
    return CheckResult(findings=findings, summary=summary + (f" ({fmt_ranks(worst[0].ranks)})" if worst else ""))


CHECK = Check(id=ID, title="DistributedSampler shards disjoint", analyze=analyze, docs=DOCS, order=30,
              probes=('ddp', 'data', 'content'),
              evidence=(*_INDEX_EVIDENCE, *OVERLAP_EVIDENCE), explains=EXPLAINS)
