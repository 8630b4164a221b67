"""optimizer-params: the optimizers step exactly the parameters that the wrapped model trains."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.schema.events import ConfigState, DDPWrap, OptimizerInfo, ReplacedParams, Step, UnchangedWeights
from ddpdoctor.schema.fingerprints import decode_fingerprints

from ddpdoctor.schema.findings import ABSENT

from ddpdoctor.analysis.symptoms import RankFailed

from ._common import fmt_ranks, sharded_skip, short_site

ID = "optimizer-params"
STUCK_STEPS = 5  # fingerprinted steps in a row with a gradient and unchanged weights
# A gradient whose RMS is at most this fraction of the median gradient RMS of its optimizer's
# parameters is zero but for rounding (a bias before BatchNorm: about 1e-7 of the others).
NEGLIGIBLE_GRADIENT = 1e-5
# A float32 weight's updates that round away count only with a gradient at least this fraction of
# the median (a learning rate far too small); below it the gradient is what does not move the weight.
SUBSTANTIAL_GRADIENT = 0.1
LOW_PRECISION = ("torch.bfloat16", "torch.float16")

DOCS = """\
## What it does
Compares what the optimizers step with what the wrapped model trains. For each DDP module, the
parameters that get gradients in its backward passes must each be stepped by some optimizer, and
an optimizer's tensors must be the model's own. It is an error when:

- an optimizer built before FSDP2's `fully_shard` steps the tensors `fully_shard` replaced: it
  swaps every parameter of the module for a new sharded (DTensor) parameter, and the optimizer
  keeps the old tensors, which the forward never uses and which never get a gradient. The rank
  sees it directly: at the optimizer's first step, it holds a tensor that a `fully_shard` call
  took out of the model (by identity, nothing copied). The error is at the optimizer's line,
  names the `fully_shard` line and the parameters; with no DDP module this is what the check
  judges of a sharded model. FSDP1 (`FullyShardedDataParallel`) with `use_orig_params=False`
  (its default) does the same with its flat parameters, and is reported the same way;
- no optimizer steps the model's parameters: the optimizers hold other tensors (a
  `copy.deepcopy` of the model, tensors replaced after the optimizer was built) that get no
  gradient, so the model's weights never change;
- some of the model's parameters get gradients but no optimizer steps them (a head replaced
  after the optimizer was built): they are named, with the line where the optimizer was built;
- weights that get non-zero gradients at five fingerprinted steps in a row, with a positive
  learning rate, are written back to the same values before each step (a `load_state_dict` in
  the loop: their version counter moves, their values do not).

A backstop looks at any other weights that never change despite their gradients, and says why
rather than guessing. Right after a step that left a weight unchanged, the rank measures the
update the optimizer applied (the learning rate times its step direction: Adam's m/(sqrt(v)+eps),
SGD's momentum buffer or gradient, decoupled weight decay) against the spacing of the weight's
dtype at its value:

- a gradient that is negligible next to the others' (a bias before a norm layer: BatchNorm removes
  the mean, so the bias's gradient is zero but for rounding) is no evidence: nothing is reported;
- an update below the weights' precision (LayerNorm scales kept in bfloat16 under AdamW: at 1.0
  bfloat16 steps by 2**-7) is a warning naming the parameters: the same on every rank, not a DDP
  fault, but training the job never gets. For float32 weights only with a gradient in the range of
  the others' (a learning rate far too small): a float32 update that rounds away otherwise means a
  gradient too small to matter, which a conv bias before BatchNorm has over large feature maps;
- anything else is an info, since nothing shows why.

A DDP model that gets gradients while no optimizer holds its parameters or a copy of them (a test
script that only compares gradients, weights updated by hand) is an info. Several optimizers that
together cover the model (GANs, actor-critic), ZeroRedundancyOptimizer, frozen parameters
(`requires_grad=False`), EMA or teacher copies that are not trained through DDP, and param groups
with `lr=0` are correct and stay silent. The comparison is by tensor identity as DDP sees it. A
model sharded without DDP (FSDP2, HSDP, FSDP1) has no DDP replica to compare: apart from the
`fully_shard` case above, the check says it does not check sharded models yet.

## Why it matters
Such a job runs, logs a loss and writes checkpoints, and every other check passes: the replicas
stay identical because nothing changes them. The model simply does not train, or part of it keeps
its random initialization.

## Example
```python
net = Net()
model = DDP(net)
ema = copy.deepcopy(net)
optimizer = torch.optim.AdamW(ema.parameters(), lr=1e-4)   # steps the copy
```
```python
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
net.fc = nn.Linear(512, num_classes)                        # the new head is never stepped
model = DDP(net)
```
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the unsharded tensors
for layer in model.layers:
    fully_shard(layer)                                      # replaces them with DTensor parameters
fully_shard(model)                                          # the optimizer steps tensors with no gradient
```

## Use instead
```python
model = DDP(net)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
ema = copy.deepcopy(net).requires_grad_(False)              # updated under no_grad, not stepped
```
```python
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after the last fully_shard: the shards
```
Change the model (new heads, dtype, device, sharding) first, then build the optimizer over
`model.parameters()`; freeze parameters with `requires_grad_(False)` or an `lr=0` param group.
"""


@dataclass
class _Model:
    """One trained module as DDP wraps it on one rank (a module wrapped again counts once)."""

    index: int
    wrap: DDPWrap
    trained: list[str]  # parameters that got a gradient in some backward
    stepped: set[str]


@dataclass(frozen=True)
class NotStepped(EvidenceRecord):
    """Parameters of a DDP model (``case`` model-not-stepped: all of them) that no optimizer steps, and
    the tensors the optimizers hold instead."""

    case: str = evidence_field(hidden=True, default="parameters-not-stepped")
    not_stepped: list[str] = evidence_field(default_factory=list)
    model_parameters: int = evidence_field(default=0)
    model_wrapped_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    optimizer: int = evidence_field(hidden=True, default=0)
    optimizer_built_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    tensors_not_in_model: list[dict[str, Any]] = evidence_field(default_factory=list)  # [{optimizer, count, shapes}]
    models: int = evidence_field(default=ABSENT)  # how many DDP models, where several


@dataclass(frozen=True)
class ReplacedBySharding(EvidenceRecord):
    """Tensors an optimizer steps that a sharding call (FSDP2's ``fully_shard``) replaced with new
    parameters after the optimizer was built."""

    discriminator = {"case": "replaced-by-sharding"}
    case: str = evidence_field(hidden=True, default="replaced-by-sharding")
    optimizer: int = evidence_field(hidden=True, default=0)
    api: str = evidence_field(label="replaced by", unit="code", default="")
    replaced: list[str] = evidence_field(label="replaced parameters", default_factory=list)
    optimizer_tensors: int = evidence_field(default=0)
    optimizer_built_at: Optional[dict[str, Any]] = evidence_field(unit="site", keep_none=True)
    sharded_at: list[dict[str, Any]] = evidence_field(default_factory=list)  # the calls, in order


@dataclass(frozen=True)
class WeightsRestored(EvidenceRecord):
    """A parameter with gradients whose weights something outside the optimizer writes back every step."""

    discriminator = {"case": "weights-restored"}
    case: str = evidence_field(hidden=True, default="weights-restored")
    optimizer: int = evidence_field(hidden=True, default=0)
    parameter: str = evidence_field(label="parameter", unit="code", default="")
    dtype: Optional[str] = evidence_field(keep_none=True)
    steps: list[int] = evidence_field(default_factory=list)


@dataclass(frozen=True)
class BelowPrecision(EvidenceRecord):
    """Updates smaller than the spacing of the weights' dtype: they round away."""

    discriminator = {"case": "updates-below-precision"}
    case: str = evidence_field(hidden=True, default="updates-below-precision")
    optimizer: int = evidence_field(hidden=True, default=0)
    parameters: list[str] = evidence_field(default_factory=list)
    dtypes: list[str] = evidence_field(default_factory=list)
    largest_update_to_spacing: float = evidence_field(default=0.0)
    steps: list[int] = evidence_field(default_factory=list)


@dataclass(frozen=True)
class NeverChange(EvidenceRecord):
    """Weights that never change despite gradients and a learning rate, for no reason ddpdoctor can tell."""

    discriminator = {"case": "weights-never-change"}
    case: str = evidence_field(hidden=True, default="weights-never-change")
    optimizer: int = evidence_field(hidden=True, default=0)
    parameters: list[str] = evidence_field(default_factory=list)
    steps: list[int] = evidence_field(default_factory=list)


def _strip(name: str, ddp: Optional[int]) -> str:
    prefix = f"ddp{ddp}:"
    return name[len(prefix):] if ddp and name.startswith(prefix) else name


def _models(evidence: Evidence, rank: int) -> list[_Model]:
    canonical = facts.ddp.canonical(evidence)
    usages = facts.ddp.usage(evidence)
    ev = evidence.ranks[rank]
    wraps: dict[int, DDPWrap] = {}
    trained: dict[int, set[str]] = {}
    for wrap in ev.of(DDPWrap):
        index = canonical.get(wrap.ddp, wrap.ddp)
        wraps.setdefault(index, wrap)
        usage = usages.get(wrap.ddp, {}).get(rank)
        if usage is not None and usage.iterations:
            trained.setdefault(index, set()).update(
                name for i, name in enumerate(wrap.params) if usage.unused.get(str(i), 0) < usage.iterations)
    stepped: dict[int, set[str]] = {}
    for info in ev.of(OptimizerInfo):
        for name, ddp in zip(info.names, info.ddp_of):
            if ddp is not None:
                stepped.setdefault(canonical.get(ddp, ddp), set()).add(_strip(name, ddp))
    return [_Model(index, wrap, [n for n in wrap.params if n in trained.get(index, set())], stepped.get(index, set()))
            for index, wrap in sorted(wraps.items())]


def _stale(evidence: Evidence, rank: int) -> dict[int, list[int]]:
    """Per optimizer: positions of its tensors outside every DDP module that got no gradient at any
    fingerprinted step."""
    ev = evidence.ranks[rank]
    outside = {info.opt: info for info in ev.of(OptimizerInfo) if not all(info.in_ddp)}
    if not outside:
        return {}
    missing: dict[int, set[int]] = {}  # positions without a gradient at every fingerprinted step so far
    for step in ev.of(Step):
        if step.grads is None or step.opt not in outside:
            continue
        # The encoding lists the positions without a gradient after a "|": no need to decode the values.
        absent = {int(i) for i in step.grads.partition("|")[2].split(",") if i}
        missing[step.opt] = absent if step.opt not in missing else missing[step.opt] & absent
    out: dict[int, list[int]] = {}
    for opt, info in outside.items():
        positions = [i for i, inside in enumerate(info.in_ddp) if not inside and i in missing.get(opt, set())]
        if positions:
            out[opt] = positions
    return out


def _site(info: Optional[OptimizerInfo]) -> Optional[Location]:
    return Location.from_site(info.built_at or info.site) if info else None


def _description(evidence: Evidence, rank: int) -> tuple:
    """What the comparison depends on for one rank, as a hashable key: ranks that describe their
    models and optimizers alike (the common case, a thousand of them) are judged once."""
    ev = evidence.ranks[rank]
    usage = facts.ddp.usage(evidence)
    return (tuple((w.ddp, tuple(w.params)) for w in ev.of(DDPWrap)),
            tuple((i.opt, tuple(i.names), tuple(i.ddp_of)) for i in ev.of(OptimizerInfo)),
            tuple((d, u[rank].iterations, tuple(u[rank].unused.items())) for d, u in usage.items() if rank in u))


def _unstepped_findings(evidence: Evidence) -> list[Finding]:
    problems: dict[tuple, dict] = {}
    judged: dict[tuple, list[_Model]] = {}
    for rank in sorted(evidence.ranks):
        infos = {i.opt: i for i in evidence.ranks[rank].of(OptimizerInfo)}
        if not infos:
            continue
        key = _description(evidence, rank)
        if key not in judged:
            judged[key] = _models(evidence, rank)
        for model in judged[key]:
            missing = [n for n in model.trained if n not in model.stepped]
            if not missing:
                continue
            stale = _stale(evidence, rank)
            # Models wrapped at the same line are one root cause (a test script builds one per case).
            site = Location.from_site(model.wrap.site)
            problem = (site or model.index, tuple(missing), not model.stepped)
            entry = problems.setdefault(problem, {"ranks": [], "models": set(), "model": model, "missing": missing,
                                              "stale": stale, "infos": infos})
            entry["models"].add(model.index)
            if rank not in entry["ranks"]:
                entry["ranks"].append(rank)
    return [_unstepped_finding(**{**entry, "models": len(entry["models"])}) for entry in problems.values()]


def _shapes(info: OptimizerInfo, positions: list[int]) -> str:
    shapes = [info.shapes[i] for i in positions[:4] if i < len(info.shapes)]
    return ", ".join(str(list(s)) for s in shapes) + (", ..." if len(positions) > 4 else "")


def _unstepped_finding(*, ranks: list[int], models: int, model: _Model, missing: list[str],
                       stale: dict[int, list[int]], infos: dict[int, OptimizerInfo]) -> Finding:
    num_stale = sum(len(v) for v in stale.values())
    holder = infos.get(next(iter(stale), -1)) or next(iter(infos.values()))
    stale_here = stale.get(holder.opt, [])
    wrapped_at = Location.from_site(model.wrap.site)
    built_at = _site(holder)
    names = ", ".join(f"`{n}`" for n in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    evidence_out = NotStepped(
        case="model-not-stepped" if not model.stepped else "parameters-not-stepped",
        not_stepped=missing,
        model_parameters=len(model.wrap.params),
        model_wrapped_at=wrapped_at.to_json() if wrapped_at else None,
        optimizer=holder.opt,
        optimizer_built_at=built_at.to_json() if built_at else None,
        tensors_not_in_model=[{"optimizer": opt, "count": len(positions),
                               "shapes": [infos[opt].shapes[i] for i in positions if i < len(infos[opt].shapes)]}
                              for opt, positions in stale.items() if opt in infos],
        models=models if models > 1 else ABSENT)
    severity = "error"
    model_text = "the DDP model" if models == 1 else f"the {models} DDP models"
    if not model.stepped:
        if num_stale:
            message = (f"no optimizer steps the parameters of {model_text} (wrapped at {short_site(wrapped_at)}): "
                       f"optimizer {holder.opt} ({holder.type_name}, built at {short_site(built_at)}) steps "
                       f"{num_stale} tensor{'s' if num_stale > 1 else ''} that the model's forward never uses (they "
                       f"get no gradient), so the model's weights never change: a copy of the model "
                       f"(`copy.deepcopy`), or tensors replaced after the optimizer was built")
        else:
            # No optimizer holds a stale copy either: nothing shows the model was meant to be stepped (a script
            # that only computes and compares gradients, weights updated by hand).
            severity = "info"
            message = (f"no optimizer steps the parameters of {model_text} (wrapped at {short_site(wrapped_at)}): "
                       f"{'its' if models == 1 else 'their'} {len(missing)} parameters get gradients in backward "
                       f"passes, and no optimizer holds them or a copy of them; fine for a script that only computes "
                       f"gradients or updates the weights by hand, not for one that means to train "
                       f"{'it' if models == 1 else 'them'} with an optimizer")
        fix = ("Build the optimizer over the model DDP trains: `optimizer = Optimizer(model.parameters(), ...)`, after "
               "every change to the model; keep copies (EMA, teacher) out of the optimizer and update them under "
               "`torch.no_grad()`.")
    else:
        message = (f"{len(missing)} parameter{'s' if len(missing) > 1 else ''} of the DDP model get gradients but no "
                   f"optimizer steps them: {names}; they keep their initial values")
        if stale_here:
            message += (f". Optimizer {holder.opt} (built at {short_site(built_at)}) holds {len(stale_here)} "
                        f"tensor{'s' if len(stale_here) > 1 else ''} that are no longer in the model (shapes "
                        f"{_shapes(holder, stale_here)}): replaced after the optimizer was built")
        fix = ("Build the optimizer after the last change to the model (a new head, a replaced layer), over "
               "`model.parameters()`, or add the new parameters with `optimizer.add_param_group`. Freeze what must "
               "not train with `requires_grad_(False)`.")
    # The info names the models (no optimizer is involved); the errors the optimizer that misses them.
    location = wrapped_at if severity == "info" else built_at
    return Finding(check=ID, severity=severity, message=message, fix=fix, ranks=tuple(ranks), location=location,
                   evidence=evidence_out)


def _replaced_findings(evidence: Evidence) -> list[Finding]:
    """Optimizers that step tensors ``fully_shard`` replaced after they were built: the rank saw
    the replaced tensor in the optimizer, by identity, at its first step. A correct script builds
    the optimizer after sharding, from the sharded parameters, and never holds one."""
    problems: dict[tuple, dict] = {}
    for rank in sorted(evidence.ranks):
        ev = evidence.ranks[rank]
        infos = {i.opt: i for i in ev.of(OptimizerInfo)}
        seen: set[int] = set()
        for event in ev.of(ReplacedParams):
            info = infos.get(event.opt)
            if event.opt in seen or info is None:
                continue
            seen.add(event.opt)
            built_at = _site(info)
            sites = [loc for loc in (Location.from_site(site) for site in event.sites) if loc is not None]
            key = (built_at or event.opt, tuple(event.names), tuple(sites))
            problems.setdefault(key, {"ranks": [], "event": event, "info": info, "built_at": built_at,
                                      "sites": sites})["ranks"].append(rank)
    return [_replaced_finding(**entry) for entry in problems.values()]


def _replaced_finding(*, ranks: list[int], event: ReplacedParams, info: OptimizerInfo, built_at: Optional[Location],
                      sites: list[Location]) -> Finding:
    count, total = len(event.positions), len(info.names)
    api = event.api or "fully_shard"
    names = ", ".join(f"`{n}`" for n in event.names[:6]) + (f" and {count - 6} more" if count > 6 else "")
    where = " and ".join(short_site(loc) for loc in sites[:3]) + (" ..." if len(sites) > 3 else "") or "?"
    held = f"all {count} of its tensors" if count == total else f"{count} of its {total} tensors"
    flat = api == "FullyShardedDataParallel"  # FSDP1 with use_orig_params=False: FlatParameters
    replacement = "its flat parameters (`use_orig_params=False`)" if flat else "new sharded parameters"
    message = (f"optimizer {info.opt} ({info.type_name}, built at {short_site(built_at)}) was built before "
               f"`{api}` (at {where}) and steps the model's old parameters: {held} ({names}) were replaced by "
               f"`{api}` with {replacement}. The forward and backward use the new ones, so the tensors "
               f"the optimizer steps never get a gradient, and "
               f"{'the model never trains' if count == total else 'these parameters never train'}")
    build = f"`optimizer = torch.optim.{info.type_name or 'AdamW'}(model.parameters(), ...)`"
    if flat:
        fix = (f"Build the optimizer after wrapping, from the wrapper's parameters: `model = "
               f"FullyShardedDataParallel(model, ...)`, then {build}; or pass `use_orig_params=True`, which keeps "
               "the original parameters (Accelerate: `fsdp_use_orig_params: true`, the default of `accelerate "
               "launch`).")
    else:
        fix = (f"Build the optimizer after the last `{api}`, from `model.parameters()` (the sharded parameters): "
               f"shard every layer and the root first, then {build}.")
    return Finding(check=ID, severity="error", message=message, fix=fix, ranks=tuple(ranks), location=built_at,
                   evidence=ReplacedBySharding(optimizer=info.opt, api=api, replaced=list(event.names),
                                               optimizer_tensors=total,
                                               optimizer_built_at=built_at.to_json() if built_at else None,
                                               sharded_at=[loc.to_json() for loc in sites]))


def _stuck_findings(evidence: Evidence) -> list[Finding]:
    """The backstop: weights with non-zero gradients and a positive learning rate that never change
    over ``STUCK_STEPS`` fingerprinted steps, judged by why they do not (never guessed):

    - the same values are written back before each step (their version counter moved): an error;
    - the gradient is negligible next to the optimizer's other gradients (a bias before a norm
      layer, whose gradient is mathematically zero): no evidence of anything, nothing reported;
    - the update the optimizer applies is smaller than the spacing of the weight's dtype at its
      value (bfloat16 LayerNorm scales under AdamW): a warning naming the parameters, the same on
      every rank and no DDP fault, but updates the job loses;
    - anything else: an info, since ddpdoctor cannot say why.
    """
    if not evidence.ranks:
        return []
    rank = min(evidence.ranks)
    ev = evidence.ranks[rank]
    states: dict[int, list[ConfigState]] = {}
    for state in ev.of(ConfigState):
        states.setdefault(state.opt, []).append(state)
    measured: dict[tuple[int, int], list[tuple[Optional[float], Optional[float], Optional[float]]]] = {}
    for event in ev.of(UnchangedWeights):
        for position, (rms, ratio) in event.params.items():
            measured.setdefault((event.opt, int(position)), []).append((rms, ratio, event.grad_rms_median))
    previous: dict[int, tuple[list, Optional[list]]] = {}  # opt -> (params after, params written before)
    streaks: dict[tuple[int, int], list[int]] = {}
    restored: set[tuple[int, int]] = set()
    stuck: dict[tuple[int, int], tuple[OptimizerInfo, list[int]]] = {}
    for step in ev.of(Step):
        if step.grads is None or step.params is None:
            continue
        info = facts.steps.optimizer_info(evidence, rank, step.opt, step.n)
        config = _config_at(states.get(step.opt, []), step)
        params = decode_fingerprints(step.params)
        written = decode_fingerprints(step.written) if step.written else None
        before = previous.get(step.opt)
        previous[step.opt] = (params, written)
        if before is None or info is None or config is None:
            continue
        grads = decode_fingerprints(step.grads)
        groups = _group_of(info)
        for i, (grad, param) in enumerate(zip(grads, params)):
            key = (step.opt, i)
            group = config.groups[groups[i]] if i < len(groups) and groups[i] < len(config.groups) else {}
            lr = group.get("lr")
            same_after = param is not None and i < len(before[0]) and param == before[0][i]
            same_written = (written is not None and before[1] is not None and i < len(written) and i < len(before[1])
                            and written[i] is not None and written[i] == before[1][i])
            if (grad is None or not grad[0] or not math.isfinite(grad[0]) or not (same_after or same_written)
                    or not isinstance(lr, (int, float)) or not lr > 0):
                streaks.pop(key, None)
                restored.discard(key)
                continue
            streak = streaks.setdefault(key, [])
            streak.append(step.n)
            if same_written:
                restored.add(key)
            if len(streak) >= STUCK_STEPS:
                stuck[key] = (info, list(streak))
    kinds: dict[str, list[tuple[OptimizerInfo, int, list[int], list]]] = {}
    for key, (info, steps) in stuck.items():
        found = measured.get(key, [])
        if key in restored:
            kind = "restored"
        elif found and all(_negligible(rms, median) for rms, _, median in found):
            continue  # a gradient that is zero but for rounding: not evidence of anything
        elif found and all(ratio is not None and ratio < 1 for _, ratio, _ in found):
            if _dtype(info, key[1]) not in LOW_PRECISION and not all(_substantial(rms, m) for rms, _, m in found):
                # A float32 weight whose update rounds away has a gradient too small to move it: a bias
                # before a norm layer (zero but for rounding, which grows with the tensor summed over),
                # a parameter the loss barely reaches. Nothing to fix, nothing reported.
                continue
            kind = "below-precision"
        else:
            kind = "unexplained"
        kinds.setdefault(kind, []).append((info, key[1], steps, found))
    findings = []
    if "restored" in kinds:
        info, index, steps, _ = kinds["restored"][0]
        findings.append(_restored(evidence, rank, info, index, steps))
    if "below-precision" in kinds:
        findings.append(_below_precision(evidence, rank, kinds["below-precision"]))
    if "unexplained" in kinds:
        findings.append(_unexplained(evidence, rank, kinds["unexplained"]))
    return findings


def _negligible(rms: Optional[float], median: Optional[float]) -> bool:
    return rms is not None and median is not None and median > 0 and rms <= NEGLIGIBLE_GRADIENT * median


def _substantial(rms: Optional[float], median: Optional[float]) -> bool:
    """A gradient in the range of the optimizer's others: its lost updates are lost training."""
    return rms is not None and median is not None and median > 0 and rms >= SUBSTANTIAL_GRADIENT * median


def _config_at(states: list[ConfigState], step: Step) -> Optional[ConfigState]:
    found = None
    for state in states:
        if state.n <= step.n and state.digest == step.config:
            found = state
    return found


def _group_of(info: OptimizerInfo) -> list[int]:
    out: list[int] = []
    for group, size in enumerate(info.group_sizes or [len(info.names)]):
        out.extend([group] * size)
    return out


def _name(info: OptimizerInfo, index: int) -> str:
    return info.names[index] if index < len(info.names) else f"param{index}"


def _dtype(info: OptimizerInfo, index: int) -> str:
    return info.dtypes[index] if index < len(info.dtypes) else ""


def _sampled_steps(evidence: Evidence) -> dict[tuple[int, int], dict[int, Step]]:
    """(optimizer step, optimizer) -> rank -> its Step, for steps with fingerprints or a config
    digest, in step order."""
    return facts.steps.sampled(evidence).steps


def _stuck_ranks(evidence: Evidence, rank: int, info: OptimizerInfo, steps: list[int]) -> tuple[int, ...]:
    last = _sampled_steps(evidence).get((steps[-1], info.opt), {})
    mine = last.get(rank)
    return tuple(sorted(r for r, e in last.items() if mine is not None and e.params == mine.params)) or (rank,)


def _names(entries: list) -> str:
    names = [f"`{_name(info, index)}`" for info, index, _, _ in entries]
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _restored(evidence: Evidence, rank: int, info: OptimizerInfo, index: int, steps: list[int]) -> Finding:
    name = _name(info, index)
    message = (f"`{name}` got non-zero gradients at optimizer steps {steps[0]}-{steps[-1]} ({len(steps)} fingerprinted "
               f"steps) with a learning rate that should move it, but its weights never changed: something outside "
               f"the optimizer writes the same values back into it before each step (its version counter moved "
               f"between steps: a `load_state_dict`, a `copy_` of saved weights)")
    fix = ("Do not restore the weights inside the training loop: load a checkpoint once, before training (and before "
           "wrapping the model in DDP).")
    return Finding(check=ID, severity="error", message=message, ranks=_stuck_ranks(evidence, rank, info, steps),
                   location=_site(info), fix=fix,
                   evidence=WeightsRestored(optimizer=info.opt, parameter=name, dtype=_dtype(info, index) or None,
                                            steps=steps))


def _below_precision(evidence: Evidence, rank: int, entries: list) -> Finding:
    info, _, steps, _ = entries[0]
    dtypes = sorted({_dtype(i, index).replace("torch.", "") for i, index, _, _ in entries if _dtype(i, index)})
    ratios = [ratio for _, _, _, found in entries for _, ratio, _ in found if ratio is not None]
    low = any(d in ("bfloat16", "float16") for d in dtypes)
    count = len(entries)
    message = (f"the optimizer's updates of {count} parameter{'s' if count > 1 else ''} ({_names(entries)}) are "
               f"smaller than the precision of their {'/'.join(dtypes) or 'weights'} weights, so they round away and "
               f"the weights never change (at most {max(ratios):.2g} of the spacing between representable values, "
               f"over {len(steps)} fingerprinted steps): the same on every rank and no DDP fault, but these "
               f"parameters never train")
    if low:
        fix = ("Keep float32 master weights: train in float32 under `torch.autocast(dtype=torch.bfloat16)` instead of "
               "`model.to(torch.bfloat16)`, or use an optimizer that keeps float32 weights (or stochastic rounding) "
               "for low-precision parameters.")
    else:
        fix = "Raise the learning rate of these parameters' param group, or keep them in a wider dtype."
    ranks = tuple(sorted({r for i, _, s, _ in entries for r in _stuck_ranks(evidence, rank, i, s)}))
    return Finding(check=ID, severity="warning", message=message, ranks=ranks, location=_site(info), fix=fix,
                   evidence=BelowPrecision(optimizer=info.opt,
                                           parameters=[_name(i, index) for i, index, _, _ in entries],
                                           dtypes=dtypes, largest_update_to_spacing=max(ratios), steps=steps))


def _unexplained(evidence: Evidence, rank: int, entries: list) -> Finding:
    info, _, steps, found = entries[0]
    count = len(entries)
    measured = any(ratio is not None for _, _, _, f in entries for _, ratio, _ in f)
    why = ("the optimizer's update should have moved them" if measured
           else f"ddpdoctor cannot compute the update of {info.type_name}")
    message = (f"{count} parameter{'s' if count > 1 else ''} ({_names(entries)}) got non-zero gradients and a positive "
               f"learning rate at {len(steps)} fingerprinted steps in a row ({steps[0]}-{steps[-1]}), but "
               f"{'their' if count > 1 else 'its'} weights never changed, and {why}: something may write them "
               f"outside the optimizer, or the optimizer may skip them; ddpdoctor cannot tell which")
    fix = ("Check that the weights change between steps (compare a parameter before and after `optimizer.step()`), and "
           "what the optimizer holds: build it over `model.parameters()` after every change to the model.")
    ranks = tuple(sorted({r for i, _, s, _ in entries for r in _stuck_ranks(evidence, rank, i, s)}))
    return Finding(check=ID, severity="info", message=message, ranks=ranks, location=_site(info), fix=fix,
                   evidence=NeverChange(optimizer=info.opt, parameters=[_name(i, index) for i, index, _, _ in entries],
                                        steps=steps))


def analyze(evidence: Evidence) -> CheckResult:
    replaced = _replaced_findings(evidence)
    if replaced and (sharded_skip(evidence) is not None or not evidence.any(DDPWrap)):
        api = replaced[0].evidence.api if isinstance(replaced[0].evidence, ReplacedBySharding) else "fully_shard"
        return CheckResult(findings=replaced, summary=f"the optimizers step tensors that `{api}` replaced "
                                                      f"({fmt_ranks(r for f in replaced for r in f.ranks)})")
    sharded = sharded_skip(evidence)
    if sharded is not None:
        return sharded
    if not evidence.any(DDPWrap):
        return CheckResult(summary="no DDP module: nothing to compare the optimizers with", applicable=False)
    if not evidence.any(OptimizerInfo):
        return CheckResult(summary="no optimizer stepped", applicable=False)
    findings = replaced + _unstepped_findings(evidence)
    if not [f for f in findings if f.severity == "error"]:
        stuck = _stuck_findings(evidence)
        findings += stuck
        if stuck and not [f for f in findings if isinstance(f.evidence, NotStepped)]:
            worst = stuck[0].evidence
            parameters = [worst.parameter] if isinstance(worst, WeightsRestored) else worst.parameters
            what = ", ".join(f"`{p}`" for p in parameters[:3]) + (" ..." if len(parameters) > 3 else "")
            return CheckResult(findings=stuck, summary=f"the weights of {what} never change despite gradients")
    if findings:
        return CheckResult(findings=findings, summary=f"the optimizers do not step the model's parameters "
                                                      f"({fmt_ranks(r for f in findings for r in f.ranks)})")
    return CheckResult(summary="the optimizers step every parameter the DDP models train")


def _replaced_by_flat_params(finding: Finding) -> bool:
    return isinstance(finding.evidence, ReplacedBySharding) and finding.evidence.api == "FullyShardedDataParallel"


_FSDP1_OPTIM_STATE = ("torch/distributed/fsdp/_optim_utils.py", "torch\\distributed\\fsdp\\_optim_utils.py")


def _optimizer_state_of_stale_tensors(symptom: Finding, _cause: Finding) -> bool:
    """FSDP1's ``optim_state_dict`` raising KeyError: it looks up each tensor the optimizer holds among
    the wrapper's parameters, and the tensors FSDP1 replaced are not there."""
    seen = symptom.evidence
    return (isinstance(seen, RankFailed) and seen.exception == "KeyError"
            and any(str(frame.get("file", "")).endswith(_FSDP1_OPTIM_STATE) for frame in seen.frames or []))


EXPLAINS = (
    # An optimizer built before FSDP1 flattened the parameters: saving its state fails on the stale tensors.
    Explains("the optimizer's state of replaced tensors", _optimizer_state_of_stale_tensors,
             cause=_replaced_by_flat_params, priority=35),
)


CHECK = Check(id=ID, title="optimizers step the trained parameters", analyze=analyze, docs=DOCS, order=140,
              probes=('optimizer', 'config', 'sharding'),
              evidence=(ReplacedBySharding, WeightsRestored, BelowPrecision, NeverChange, NotStepped),
              explains=EXPLAINS)
