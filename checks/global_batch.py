"""global-batch: DDP's averaged gradient is the gradient one process would compute on the same
global batch (and the same accumulation window)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.one_rank import Judgement, judge
from ddpdoctor.schema.events import LossWindow
from ddpdoctor.schema.observations import OneRankReplay

from ._common import fmt_ranks, short_site

ID = "global-batch"

# Weights of one global batch's elements closer than this (relative) are equal: counts are exact
# integers, so anything above it is a real difference; a 1% one changes the update by less than noise.
TOLERANCE = 0.01
# A loss factor within this of 1/world_size (or world_size) is that factor (floating point of a division).
SCALE_TOLERANCE = 1e-6
DOCS = """\
## What it does
Compares DDP's averaged gradient with the gradient of the global batch, the union of every rank's
batch (and of every micro-batch of an accumulation window):

    one process:  g = (1/N) * sum over all N elements of grad(l_i)
    DDP:          g = (1/W) * sum over ranks r of (f_r/n_r) * sum over rank r's n_r elements of grad(l_i)
    equal only if every element weighs the same: f_r/(W*n_r) = 1/N for every rank and micro-batch

where n_r is how many elements contribute to rank r's mean-reduced loss (targets not equal to
`ignore_index`) and f_r the constant factor between that loss and `backward()` (a division by the
accumulation steps is 1/4). On the steps the fingerprints sample (at the default schedule's pace
when `--fingerprint-every` asks for more), each rank records its calls of
`cross_entropy`/`nll_loss` (and their module forms) with their counts, and walks the autograd graph
from `backward()`'s root to them, through additions, scalings, means and sums only. No collective
is added. It warns when:

- the elements of one global batch weigh differently: a mean over a rank's own tokens when ranks
  (or the micro-batches of a window) hold different token counts, combined with constant factors.
  The figures are the weight of the heaviest element against the lightest ("rank 1's tokens weigh
  1.8x rank 0's at step 3") and the distance of the averaged gradient from the global batch's
  (relative L2 over the first coordinates of each parameter's local gradient, sampled before DDP's
  all-reduce; each micro-batch's part is its read minus the previous one);
- the loss is divided (or multiplied) by the world size on top of DDP's average, where a line between
  the loss and `backward()` names the world size: the update is 1/W of the global batch's, and shrinks
  with every GPU added.

A loss summed and divided by the global count (all-reduced), times the world size (transformers'
`num_items_in_batch`), fixed-length windows, equal batches with a mean loss, label smoothing and class
weights equal on every rank weigh every element the same and stay silent; so do BatchNorm and dropout.
A hand-written masked mean (`(loss * mask).sum() / mask.sum()`) is a mean over its mask's count; a
loss weighted elementwise by anything but a 0/1 mask is not judged.

With `--against-one-rank K`, ddpdoctor also replays the job's first K optimizer steps in one
process on the global batch of each step (the ranks' batches joined, or the union of their sample
indices collated by the loader), each step from rank 0's weights before it, and compares the losses
and DDP's averaged gradients within the probabilistic rounding bound λ·√n·u (Higham and Mary 2019;
u the unit roundoff of the step's lowest precision, n the global batch's largest tensor times the
widest fan-in, λ = 6). It names the first step and parameter where N ranks differ from one process
(a consequence of the cause above, or a warning of its own), or says, as an info, what makes an
exact comparison impossible: dropout, BatchNorm's per-rank statistics, random draws in the step,
data not from a DataLoader.

## Why it matters
The job trains, but not as it would on one process: the result depends on the number of GPUs
("my job trains worse on 8 GPUs than on 1"). Padded sequences give ranks different token counts at
every step; a per-rank mean then gives a token on a rank with few tokens more weight than one on a
rank with many. Dividing by the world size "to average across GPUs" divides twice: DDP averages.

## Example
```python
logits = model(inputs)
loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1), ignore_index=-100)  # mean over this rank's tokens
loss.backward()                                                                     # DDP averages the means
```

## Use instead
```python
tokens = (labels != -100).sum()
dist.all_reduce(tokens)                                                  # the global batch's token count
loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1), reduction="sum")
(loss / tokens * dist.get_world_size()).backward()                       # DDP's average cancels the factor
```
With gradient accumulation, count the tokens of the whole window. Hugging Face's Trainer does this
when the model accepts `num_items_in_batch` (`average_tokens_across_devices=True`).
"""


@dataclass(frozen=True)
class UnequalWeights(EvidenceRecord):
    """Elements of one global batch that weigh differently in the averaged gradient."""

    discriminator = {"case": "unequal-weights"}
    case: str = evidence_field(hidden=True, default="unequal-weights")
    step: int = evidence_field(label="first step")
    loss: str = evidence_field(label="loss")
    counts: dict[str, list[int]] = evidence_field(label="contributing elements", default_factory=dict)
    weight_ratio: float = evidence_field(label="weight ratio", unit="times")
    worst_step: int = evidence_field(label="worst step")
    worst_ratio: float = evidence_field(label="worst weight ratio", unit="times")
    steps_compared: int = evidence_field(label="steps compared")
    steps_unequal: int = evidence_field(label="steps unequal")
    # |averaged - global| / |global| of the gradient at ``step``, over sampled coordinates of the ranks'
    # local gradients (None: not measurable there, e.g. several losses in one backward)
    gradient_distance: Optional[float] = evidence_field(label="distance from the global batch's gradient",
                                                        unit="fraction", keep_none=True, default=None)
    coordinates: int = evidence_field(label="sampled coordinates", default=0)


@dataclass(frozen=True)
class ScaledByWorldSize(EvidenceRecord):
    """A loss scaled by the world size on top of DDP's average."""

    discriminator = {"case": "world-size-scaling"}
    case: str = evidence_field(hidden=True, default="world-size-scaling")
    factor: float = evidence_field(label="loss factor")
    world_size: int = evidence_field(label="world size")
    scaled_at: Optional[dict[str, Any]] = evidence_field(label="scaled at", keep_none=True)
    steps_compared: int = evidence_field(label="steps compared")


@dataclass(frozen=True)
class OneRankDiffers(EvidenceRecord):
    """--against-one-rank: the first step where N ranks and one process differ beyond rounding."""

    discriminator = {"case": "one-rank-differs"}
    case: str = evidence_field(hidden=True, default="one-rank-differs")
    step: int = evidence_field(label="first differing step")
    quantity: str = evidence_field(label="differs in")
    parameter: Optional[str] = evidence_field(label="parameter", keep_none=True)
    distance: float = evidence_field(label="distance from one process", unit="fraction")
    tolerance: float = evidence_field(label="tolerance (rounding bound)", unit="fraction")
    loss_ranks: Optional[float] = evidence_field(label="loss, N ranks", keep_none=True)
    loss_one: Optional[float] = evidence_field(label="loss, one process", keep_none=True)
    scale: Optional[float] = evidence_field(label="gradient ratio", unit="times", keep_none=True, default=None)
    steps_compared: int = evidence_field(label="steps compared", default=0)


@dataclass(frozen=True)
class OneRankLimited(EvidenceRecord):
    """--against-one-rank: why the replay cannot compare exactly (or could not run)."""

    discriminator = {"case": "one-rank-limited"}
    case: str = evidence_field(hidden=True, default="one-rank-limited")
    limits: list[str] = evidence_field(label="limits", default_factory=list)
    steps_compared: int = evidence_field(label="steps compared", default=0)
    largest_distance: Optional[float] = evidence_field(label="largest gradient distance (not judged)",
                                                       unit="fraction", keep_none=True, default=None)


@dataclass(frozen=True)
class _Item:
    rank: int
    micro: int  # which call of this loss in the rank's window (a micro-batch)
    count: int
    weight: float  # of one contributing element, up to DDP's common 1/W


def _windows(evidence: Evidence) -> dict[int, dict[int, LossWindow]]:
    """step -> rank -> its window."""
    out: dict[int, dict[int, LossWindow]] = {}
    for rank, event in evidence.events(LossWindow):
        out.setdefault(event.step, {})[rank] = event
    return out


def _key(call: dict[str, Any]) -> tuple:
    site = (call.get("site") or [{}])[0]
    return site.get("file"), site.get("line"), call.get("fn"), call.get("reduction")


def _weighed(call: dict[str, Any]) -> bool:
    """A call whose per-element weight is known: reached from a backward through scalar factors only."""
    return (call.get("factor") is not None and not call.get("elementwise") and call.get("count")
            and call.get("reduction") in ("mean", "sum", "none") and call["factor"] > 0)


def _weight(call: dict[str, Any]) -> float:
    """The weight of one element of a weighed call, up to DDP's common 1/W: a mean's factor over its
    count, a summed (or per-element) loss's factor."""
    return float(call["factor"] / call["count"] if call["reduction"] == "mean" else call["factor"])


def _items(per_rank: dict[int, LossWindow]) -> dict[tuple, list[_Item]]:
    groups: dict[tuple, list[_Item]] = {}
    for rank, window in sorted(per_rank.items()):
        micro: dict[tuple, int] = {}
        for call in window.calls:
            if not _weighed(call):
                continue
            key = _key(call)
            index = micro[key] = micro.get(key, -1) + 1
            weight = _weight(call)
            groups.setdefault(key, []).append(_Item(rank, index, int(call["count"]), weight))
    return groups


def _unequal(windows: dict[int, dict[int, LossWindow]]) -> tuple[list[tuple[int, tuple, list[_Item], float]], int]:
    """(step, loss key, items, max/min weight) of every compared step whose elements weigh unequally,
    and how many steps were compared."""
    found = []
    compared = 0
    for step, per_rank in sorted(windows.items()):
        if len(per_rank) < 2:
            continue
        counted = False
        for key, items in sorted(_items(per_rank).items(), key=lambda kv: str(kv[0])):
            if len({i.rank for i in items}) < 2 and len(items) < 2:
                continue
            counted = True
            weights = [i.weight for i in items]
            ratio = max(weights) / min(weights)
            if ratio > 1 + TOLERANCE:
                found.append((step, key, items, ratio))
        compared += counted
    return found, compared


def _describe_items(items: list[_Item], ratio: float) -> str:
    heavy = max(items, key=lambda i: i.weight)
    light = min(items, key=lambda i: i.weight)
    if heavy.rank != light.rank:
        return f"rank {heavy.rank}'s elements weigh {ratio:.2f}x rank {light.rank}'s"
    return (f"on rank {heavy.rank}, micro-batch {heavy.micro + 1}'s elements weigh {ratio:.2f}x "
            f"micro-batch {light.micro + 1}'s")


def _counts(items: list[_Item], reduction: str) -> dict[str, list[int]]:
    """rank -> per micro-batch, the count each loss is a mean over: the contributing targets of a
    mean-reduced loss, the divisor of a summed one (a hand-written masked mean's ``mask.sum()``)."""
    out: dict[str, list[int]] = {}
    for item in sorted(items, key=lambda i: (i.rank, i.micro)):
        out.setdefault(str(item.rank), []).append(item.count if reduction == "mean" else round(1 / item.weight))
    return out


def _distance(per_rank: dict[int, LossWindow], key: tuple, world_size: int) -> Optional[tuple[float, int]]:
    """(|averaged - global| / |global|, coordinates) of the step's gradient, from each rank's sampled
    local gradients: each backward's contribution C (its read minus the previous one), weighted
    by its element weight w and count n, gives averaged = (1/W) sum C and global = (1/N) sum C/w.
    None where it cannot be separated: a backward with another loss, samples missing or unaligned."""
    layout: Optional[list] = None
    averaged: Optional[list[float]] = None
    global_sum: Optional[list[float]] = None
    total = 0.0
    for _, window in sorted(per_rank.items()):
        calls = window.calls
        if (not window.grad_samples or len(window.grad_samples) != len(calls) or len(calls) != window.backwards
                or any(_key(c) != key or not _weighed(c) for c in calls)):
            return None
        if layout is None:
            layout = window.grad_layout
            averaged = [0.0] * len(window.grad_samples[0])
            global_sum = [0.0] * len(window.grad_samples[0])
        elif window.grad_layout != layout:
            return None
        assert averaged is not None and global_sum is not None
        previous = [0.0] * len(averaged)
        for call, read in zip(calls, window.grad_samples):
            if len(read) != len(averaged):
                return None
            weight = _weight(call)
            # the elements it sums: its contributing targets; a per-element ("none") loss is a masked mean
            # over 1/weight of them (its mask's count)
            count = call["count"] if call["reduction"] in ("mean", "sum") else 1 / weight
            total += count
            for i, (now, before) in enumerate(zip(read, previous)):
                contribution = now - before
                averaged[i] += contribution / world_size
                global_sum[i] += contribution / weight
            previous = read
    if averaged is None or global_sum is None or not total:
        return None
    reference = [g / total for g in global_sum]
    norm = sum(g * g for g in reference) ** 0.5
    if not norm:
        return None
    return sum((a - g) ** 2 for a, g in zip(averaged, reference)) ** 0.5 / norm, len(averaged)


def _unequal_finding(found: list[tuple[int, tuple, list[_Item], float]], compared: int,
                     windows: dict[int, dict[int, LossWindow]], world_size: int) -> Finding:
    step, key, items, ratio = found[0]
    measured = _distance(windows[step], key, world_size)
    worst_step, _, worst_items, worst = max(found, key=lambda f: f[3])
    file, line, fn, reduction = key
    location = Location(file=file, line=int(line)) if file and line is not None else None
    micro_batches = max(i.micro for i in items) + 1
    counts = _counts(items, reduction)
    shown = "; ".join(f"rank {r}: {', '.join(map(str, c))}" for r, c in counts.items())
    window = f" over {micro_batches} micro-batches" if micro_batches > 1 else ""
    if reduction == "mean":
        what = (f"`{fn}` (mean) is a mean over each rank's own elements{window}, and the elements that contribute "
                f"differ in number ({shown} at step {step})")
    else:
        what = (f"`{fn}` ({reduction}) is divided by each rank's own count{window}, and the counts differ "
                f"({shown} at step {step})")
    distance = (f"; the averaged gradient is {measured[0]:.1%} away from the global batch's (relative L2 over "
                f"{measured[1]} sampled coordinates)") if measured else ""
    message = (f"the averaged gradient is not the global batch's: {what}, so "
               f"{_describe_items(items, ratio)} at step {step}{distance} (worst weight ratio: {worst:.2f}x at step "
               f"{worst_step}; {len({f[0] for f in found})} of {compared} compared steps). The result depends on the "
               "number of GPUs")
    fix = ("Weigh every element of the global batch the same: sum the loss (`reduction=\"sum\"`) and divide by the "
           "global count of contributing elements (all_reduce the count; with gradient accumulation, the count of "
           "the whole window), times the world size to cancel DDP's average. Hugging Face's Trainer does it when the "
           "model accepts `num_items_in_batch`.")
    ranks = tuple(sorted({i.rank for i in items}))
    return Finding(check=ID, severity="warning", message=message, fix=fix, ranks=ranks, location=location,
                   evidence=UnequalWeights(step=step, loss=f"{fn} ({reduction})", counts=counts,
                                           weight_ratio=round(ratio, 4), worst_step=worst_step,
                                           worst_ratio=round(worst, 4), steps_compared=compared,
                                           steps_unequal=len({f[0] for f in found}),
                                           gradient_distance=round(measured[0], 4) if measured else None,
                                           coordinates=measured[1] if measured else 0))


def _total_factor(window: LossWindow) -> Optional[float]:
    """The sum of the factors of the window's mean-type losses reached from a backward; None if none."""
    factors = [c["factor"] for c in window.calls
               if c.get("reduction") == "mean" and c.get("factor") is not None and not c.get("elementwise")]
    factors += [m["factor"] for m in window.means if m.get("factor") is not None]
    return sum(factors) if factors else None


def _scaled(evidence: Evidence, windows: dict[int, dict[int, LossWindow]]) -> Optional[Finding]:
    """Every compared window's losses scaled by 1/W (or W) in all, where a line names the world size."""
    world = evidence.world_size
    compared = 0
    common: Optional[float] = None
    first: Optional[LossWindow] = None
    for _, per_rank in sorted(windows.items()):
        if len(per_rank) < 2:
            continue
        for window in per_rank.values():
            total = _total_factor(window)
            if total is None:
                return None
            if common is None:
                common, first = total, window
            elif abs(total - common) > SCALE_TOLERANCE * abs(common):
                return None
        compared += 1
    if not compared or common is None or first is None:
        return None
    divided = abs(common * world - 1) <= SCALE_TOLERANCE
    multiplied = abs(common / world - 1) <= SCALE_TOLERANCE
    if not (divided or multiplied):
        return None
    where = Location.from_site(first.scaling_at)
    if where is None:
        return None  # a factor that equals 1/W by chance (0.5 with 2 ranks) is no evidence
    loss = next((Location.from_site(c.get("site")) for c in first.calls if c.get("factor") is not None), None)
    if divided:
        message = (f"the loss is divided by the world size ({world}) at {short_site(where)} on top of DDP's average: "
                   f"the update is 1/{world} of the global batch's, and shrinks with every GPU added")
        fix = ("Remove the division: DDP already averages the ranks' gradients, so each rank's mean loss gives the "
               "global batch's gradient.")
    else:
        message = (f"the loss is multiplied by the world size ({world}) at {short_site(where)}, and nothing divides "
                   f"it by a global count: the update is {world}x the global batch's")
        fix = ("Multiply by the world size only to cancel DDP's average after dividing by the global batch's count "
               "(a sum over the global batch), or not at all.")
    return Finding(check=ID, severity="warning", message=message, fix=fix, ranks=tuple(sorted(_ranks_of(windows))),
                   location=loss or where,
                   evidence=ScaledByWorldSize(factor=round(common, 6), world_size=world, scaled_at=where.to_json(),
                                              steps_compared=compared))


def _ranks_of(windows: dict[int, dict[int, LossWindow]]) -> set[int]:
    return {r for per_rank in windows.values() for r in per_rank}


def _replay_findings(replay: OneRankReplay, world_size: int) -> tuple[Optional[Finding], str]:
    """(a finding for the replay, or None where it agrees; a sentence for the summary)."""
    if replay.error:
        return Finding(check=ID, severity="info", message=f"--against-one-rank could not compare: {replay.error}",
                       fix="See the message; the rest of the report does not depend on the replay.",
                       evidence=OneRankLimited(limits=[replay.error])), "the one-process replay could not run"
    judged: Judgement = judge(replay)
    limits = list(judged.limits)
    if judged.tolerance is None and not limits:
        limits.append(f"{replay.precision} cannot resolve the difference: its rounding bound over sums of this length "
                      f"exceeds 10%")
    if limits:
        message = ("the one-process replay cannot compare exactly: " + "; ".join(limits)
                   + f" (largest gradient distance {judged.largest:.2%} over {judged.steps} steps, not judged)")
        return Finding(check=ID, severity="info", message=message,
                       fix="To compare exactly, run the check with dropout off (p=0), BatchNorm in eval mode or "
                           "SyncBatchNorm, and batches the ranks' loaders can give back.",
                       evidence=OneRankLimited(limits=limits, steps_compared=judged.steps,
                                               largest_distance=round(judged.largest, 6))), "not exactly comparable"
    assert judged.tolerance is not None
    if judged.difference is None:
        return None, (f"a one-process replay of {judged.steps} steps agrees within rounding ({judged.parameters} "
                      f"gradients compared per step, largest distance {judged.largest:.2g}, tolerance "
                      f"{judged.tolerance:.2g})")
    d = judged.difference
    what = f"`{d.parameter}`'s gradient" if d.what == "gradient" else "the loss"
    scale = ""
    if d.scale is not None and abs(d.scale - 1) > judged.tolerance:
        named = f" = 1/{world_size}, the world size" if abs(d.scale * world_size - 1) < 1e-3 else \
            f" = {world_size}, the world size" if abs(d.scale / world_size - 1) < 1e-3 else ""
        scale = f"; the averaged gradient is {d.scale:.4g}x one process's{named}"
    losses = f"; loss {d.loss_ranks:.6g} on {world_size} ranks, {d.loss_one:.6g} in one process" \
        if d.loss_ranks is not None and d.loss_one is not None else ""
    message = (f"{world_size} ranks do not train like one process on the same global batch: from step {d.step}, "
               f"{what} is {d.distance:.2%} away from one process's, beyond the rounding bound "
               f"({judged.tolerance:.2g}){scale}{losses} (replay of {judged.steps} steps from the same weights)")
    return Finding(check=ID, severity="warning", message=message,
                   fix="Normalize the loss by the global batch (see `ddpdoctor explain global-batch`).",
                   evidence=OneRankDiffers(step=d.step, quantity=d.what, parameter=d.parameter,
                                           distance=round(d.distance, 6), tolerance=float(f"{judged.tolerance:.3g}"),
                                           loss_ranks=d.loss_ranks, loss_one=d.loss_one,
                                           scale=round(d.scale, 6) if d.scale is not None else None,
                                           steps_compared=judged.steps)), f"differs from one process at step {d.step}"


def analyze(evidence: Evidence) -> CheckResult:
    result = _analyze(evidence)
    replay = evidence.observations.one_rank
    if replay is None or not result.applicable and not replay.steps and not replay.error:
        return result
    finding, said = _replay_findings(replay, evidence.world_size)
    findings = list(result.findings)
    if finding is not None and findings and finding.severity == "warning":
        first = findings[0]  # the cause the probes found; the replay's difference is its consequence
        findings[0] = dataclasses.replace(first, consequences=(*first.consequences, finding.as_consequence()))
    elif finding is not None:
        findings.append(finding)
    summary = f"{result.summary}; {said}" if result.applicable else said
    return CheckResult(findings=findings, summary=summary)


def _analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    if not (facts.ddp.wraps(evidence) or facts.ddp.sharding(evidence)):
        return CheckResult(summary="no DDP or sharded model averages the gradients", applicable=False)
    windows = _windows(evidence)
    if not any(len(per_rank) >= 2 for per_rank in windows.values()):
        return CheckResult(summary="no probed loss (cross_entropy, nll_loss, a mean-reduced loss) reached from a "
                                   "backward at a sampled step on two ranks", applicable=False)
    found, compared = _unequal(windows)
    findings = [_unequal_finding(found, compared, windows, evidence.world_size)] if found else []
    scaled = _scaled(evidence, windows)
    if scaled is not None:
        findings.append(scaled)
    if findings:
        return CheckResult(findings=findings, summary=f"the averaged gradient is not the global batch's "
                                                      f"({fmt_ranks(r for f in findings for r in f.ranks)})")
    if not compared:
        return CheckResult(summary="no loss weighed per element at a compared step (no cross_entropy/nll_loss "
                                   "reached from a backward through scalar factors)", applicable=False)
    return CheckResult(summary=f"every element of the global batch weighs the same at {compared} compared steps")


CHECK = Check(id=ID, title="N ranks train like one process on the global batch", analyze=analyze, docs=DOCS,
              order=150, probes=("loss", "optimizer", "ddp", "sharding", "one_rank"),
              evidence=(UnequalWeights, ScaledByWorldSize, OneRankDiffers, OneRankLimited))
