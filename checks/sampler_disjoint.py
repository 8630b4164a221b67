"""sampler-disjoint: per epoch and loader, each sample goes to exactly one rank."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ddpdoctor.check_api import Check, CheckResult, Finding, Location
from ddpdoctor.evidence import Evidence
from ddpdoctor.indices import decode_indices

from ._common import fmt_ranks

ID = "sampler-disjoint"

DOCS = """\
## What it does
Records which sample indices each rank drew from every DataLoader in every pass (epoch), from the
sampler or batch sampler, with any number of workers, and compares the ranks' sets:

- **overlap**: samples seen by more than one rank (DataLoader with `shuffle=True` and no
  `DistributedSampler`, samplers seeded differently per rank, wrong `num_replicas`/`rank`);
- **never seen**: samples no rank drew (e.g. `num_replicas` larger than the world size);
- **padding duplicates**: `DistributedSampler` repeats a few samples so every rank gets the same
  count. Harmless for training, reported as info; in an evaluation loader they are counted twice
  in your metrics, reported as a warning.

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


def _expected_padding(sampler: dict, dataset_len: int, world_size: int) -> int:
    if sampler.get("distributed") and not sampler.get("drop_last") and sampler.get("total_size"):
        return max(0, sampler["total_size"] - dataset_len)
    return 0


def _expected_unseen(sampler: dict, loader_drop_last: bool, batch_size: Optional[int], dataset_len: int,
                     world_size: int) -> int:
    allowed = 0
    if sampler.get("distributed") and sampler.get("drop_last") and sampler.get("num_samples"):
        allowed += max(0, dataset_len - sampler["num_samples"] * world_size)
    if loader_drop_last and batch_size:
        allowed += world_size * (batch_size - 1)
    return allowed


def _fix_for(sampler: dict, world_size: int) -> str:
    if not sampler.get("distributed"):
        return ("Give the training DataLoader a `DistributedSampler(dataset)` (sampler=..., and no shuffle=True on "
                "the loader), and call `sampler.set_epoch(epoch)` every epoch.")
    if sampler.get("num_replicas") not in (None, world_size):
        return (f"Leave `num_replicas` and `rank` at their defaults (the process group's world size {world_size} "
                "and rank), or pass dist.get_world_size() and dist.get_rank().")
    return "Use the same `seed` on every rank: `DistributedSampler(dataset, seed=SEED)` with SEED not depending on the rank."


def _analyze_pass(key: tuple[str, int], events: dict[int, dict], world_size: int) -> Optional[Finding]:
    any_event = next(iter(events.values()))
    dataset_len = any_event.get("dataset_len")
    sampler = any_event.get("sampler") or {}
    is_train = any(e.get("steps", 0) > 0 for e in events.values())
    per_rank = {r: set(decode_indices(e["indices"])) for r, e in events.items() if e.get("indices") is not None}
    if len(per_rank) < 2:
        return None
    counts = Counter(i for s in per_rank.values() for i in s)
    shared = sorted(i for i, c in counts.items() if c > 1)
    location = Location.from_site(any_event.get("site"))
    loader_name = f"the {'training' if is_train else 'evaluation'} DataLoader"
    base = {"loader": key[0], "pass": key[1], "sampler": sampler.get("type"), "dataset_len": dataset_len,
            "samples_per_rank": {str(r): e.get("num_samples") for r, e in sorted(events.items())},
            "epoch": sampler.get("epoch")}
    ranks = tuple(sorted(per_rank))
    padding = _expected_padding(sampler, dataset_len or 0, world_size)
    if shared and len(shared) > padding:
        everyone_everything = all(len(s) == len(counts) for s in per_rank.values())
        evidence = {**base, "num_shared": len(shared), "shared_examples": shared[:10]}
        if not is_train and everyone_everything:
            return Finding(check=ID, severity="info", ranks=ranks, location=location, evidence=evidence,
                           message=(f"every rank iterated all {len(counts)} samples of {loader_name} (pass {key[1]}): "
                                    "the evaluation is repeated on each rank rather than sharded"),
                           fix="Shard evaluation with DistributedSampler(dataset, shuffle=False) and all_reduce the "
                               "metric sums, or evaluate on rank 0 only.")
        severity = "error" if is_train else "warning"
        return Finding(check=ID, severity=severity, ranks=ranks, location=location, evidence=evidence,
                       message=(f"{len(shared)} of {dataset_len} samples of {loader_name} were drawn by more than one "
                                f"rank in pass {key[1]} (sampler {sampler.get('type')})"),
                       fix=_fix_for(sampler, world_size))
    if shared:
        evidence = {**base, "num_padding_duplicates": len(shared), "padding_examples": shared[:10]}
        if is_train:
            return Finding(check=ID, severity="info", ranks=ranks, location=location, evidence=evidence,
                           message=(f"DistributedSampler padded {loader_name} with {len(shared)} repeated samples so "
                                    f"every rank gets the same count ({dataset_len} samples on {world_size} ranks)"),
                           fix="Nothing to do for training; pass drop_last=True to the sampler to avoid the repeats.")
        return Finding(check=ID, severity="warning", ranks=ranks, location=location, evidence=evidence,
                       message=(f"DistributedSampler padded {loader_name} with {len(shared)} repeated samples: metrics "
                                "summed across ranks count them twice"),
                       fix=("Evaluate with a sampler that does not pad (e.g. split indices by hand with "
                            "torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size))) and sum the "
                            "counts with all_reduce, or make the dataset size a multiple of the world size."))
    complete = all(e.get("complete") for e in events.values()) and len(events) == world_size
    if complete and dataset_len:
        unseen = dataset_len - len(counts)
        allowed = _expected_unseen(sampler, bool(any_event.get("drop_last")), any_event.get("batch_size"),
                                   dataset_len, world_size)
        if unseen > allowed:
            severity = "error" if unseen > dataset_len // 4 else "warning"
            return Finding(check=ID, severity=severity, ranks=ranks, location=location,
                           evidence={**base, "num_unseen": unseen, "expected_unseen": allowed,
                                     "sampler_num_replicas": sampler.get("num_replicas"), "world_size": world_size},
                           message=(f"{unseen} of {dataset_len} samples of {loader_name} were drawn by no rank in "
                                    f"pass {key[1]}"),
                           fix=_fix_for(sampler, world_size))
    return None


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    by_pass: dict[tuple[str, int], dict[int, dict]] = {}
    for rank, event in evidence.events("loader_pass"):
        if event.get("num_batches", 0) > 0:
            by_pass.setdefault((event["loader"], event["number"]), {})[rank] = event
    comparable = {k: v for k, v in by_pass.items() if len(v) >= 2}
    if not comparable:
        return CheckResult(summary="no DataLoader pass seen on two ranks", applicable=False)
    first_per_loader: dict[tuple[str, str], Finding] = {}
    affected: Counter = Counter()
    for key in sorted(comparable, key=lambda k: (k[1], k[0])):
        finding = _analyze_pass(key, comparable[key], evidence.world_size)
        if finding is None:
            continue
        slot = (key[0], finding.severity)
        affected[slot] += 1
        first_per_loader.setdefault(slot, finding)
    findings = []
    for slot, finding in first_per_loader.items():
        finding.evidence["num_passes_affected"] = affected[slot]
        findings.append(finding)
    loaders = {k[0] for k in comparable}
    if not findings:
        return CheckResult(summary=f"{len(comparable)} passes over {len(loaders)} loader(s): shards disjoint")
    worst = [f for f in findings if f.severity != "info"]
    summary = (f"overlapping or missing samples in {len(worst)} loader(s)" if worst
               else f"{len(comparable)} passes over {len(loaders)} loader(s): shards disjoint")
    return CheckResult(findings=findings, summary=summary + (f" ({fmt_ranks(findings[0].ranks)})" if worst else ""))


CHECK = Check(id=ID, title="DistributedSampler shards disjoint", analyze=analyze, docs=DOCS)
