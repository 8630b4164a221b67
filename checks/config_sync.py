"""config-sync: every rank trains the same network with the same settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import Divergence, ParametersUnused, RankFailed, ReplicasDiverged
from ddpdoctor.schema.events import ConfigState, ModeChange, OptimizerInfo, ParamGroupsWrite, Step
from ddpdoctor.schema.sampling import describe

from ._common import fmt_ranks, sharded_skip, short_site

ID = "config-sync"

DOCS = """\
## What it does
At every fingerprinted optimizer step (the gradient-sync schedule), each rank records a digest of
what must be equal on every rank: the `training` flag of every module of each DDP module, the
`requires_grad` flag of each of its parameters, every number and flag of the optimizer's param
groups (lr, momentum or betas, weight decay...), autocast at the DDP forward (on or off, dtype),
and a GradScaler's scale. The digests are compared across ranks like the gradient fingerprints;
no collective is added. A mismatch names the first step where the ranks differ, what differs with
each rank's value, and the line that changed it: `Module.train()`/`eval()` calls and writes to
`param_groups` (LR schedulers, direct writes) are recorded where they happen.

What differs by rank in correct code is not compared: dropout masks, data augmentation, per-rank
seeds, metrics. Evaluation on rank 0 that restores train mode, schedulers stepped on every rank
and a backbone frozen and unfrozen on every rank keep the ranks equal at every step.

## Why it matters
DDP averages gradients; it does not check that the ranks computed them with the same network.
A rank left in eval mode trains without dropout and with BatchNorm's running statistics while the
others do not, a learning rate scheduled on rank 0 only moves the replicas apart, a parameter
frozen on some ranks makes DDP wait for its gradient. The first two pass every other check:
gradients are still averaged, and DDP broadcasts rank 0's buffers.

## Example
```python
model.train()
for epoch in range(epochs):
    for x, y in loader:
        train_step(model, x, y)
    if rank == 0:
        model.module.eval()          # never switched back: rank 0 now trains in eval mode
        validate(model.module)
```

## Use instead
```python
    if rank == 0:
        model.module.eval()
        validate(model.module)
        model.module.train()
```
Call `model.train()` at the start of every epoch on every rank; step schedulers and change
hyperparameters on every rank (`if rank == 0:` only around logging); freeze and unfreeze on
every rank; use the same autocast and GradScaler settings everywhere.

A resume that restores the optimizer's state on some ranks only (`if rank == 0:
optimizer.load_state_dict(...)`) is the same fault one level down: rank 0's Adam continues with its
moments and step count while the others start from nothing, so their updates differ from the
first step. It is reported at the `load_state_dict` line, with each rank's state (ranks that got
the same state another way, or a sharded optimizer's ranks, are not compared this way).
"""

SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm", "MultiheadAttention", "Transformer")


@dataclass(frozen=True)
class StateRestored(EvidenceRecord):
    """An optimizer's state restored (load_state_dict) on some ranks only: each rank's state."""

    discriminator = {"what": "optimizer state"}
    what: str = evidence_field(label="differs", default="optimizer state")
    optimizer: int = evidence_field(hidden=True, default=0)
    step: int = evidence_field(label="optimizer step", default=1)
    restored_on: list[int] = evidence_field(default_factory=list)
    not_restored_on: list[int] = evidence_field(default_factory=list)
    restored_at: Optional[dict[str, Any]] = evidence_field(keep_none=True)
    state: dict[str, str] = evidence_field(default_factory=dict)


@dataclass(frozen=True)
class SettingsDiffer(EvidenceRecord):
    """The first step at which the ranks' settings differ: each difference in words (``what``) and as a
    record (``differs``: [{what, key, label, values, text}], for tools), and the call that changed one."""

    what: list[str] = evidence_field(label="differs", default_factory=list)
    step: int = evidence_field(label="optimizer step", default=0)
    optimizer: int = evidence_field(hidden=True, default=0)
    changed_by: Optional[dict[str, Any]] = evidence_field(keep_none=True, units={"call": "code"})
    last_identical_step: Optional[int] = evidence_field(keep_none=True)
    rank_groups: list[list[int]] = evidence_field(hidden=True, default_factory=list)
    differs: list[dict[str, Any]] = evidence_field(hidden=True, default_factory=list)

    @property
    def frozen(self) -> bool:
        """Parameters are frozen (requires_grad) on some ranks and not on others."""
        return any(d.get("what") == "frozen" for d in self.differs)


def _follows_settings(symptom: Finding, cause: Finding) -> bool:
    """Replicas that drift apart at or after the step where the ranks' settings first differ (a
    learning rate, a loss scale); with parameters frozen on some ranks only, DDP's missing gradients."""
    seen, settings = symptom.evidence, cause.evidence
    if isinstance(seen, ReplicasDiverged):
        return (seen.case in (Divergence.PARAMS_MODIFIED, Divergence.MODIFIED_AFTER_BACKWARD,
                              Divergence.REDUCTION_INCOMPLETE)
                and (seen.step or 0) >= (settings.step or 0))
    frozen = isinstance(settings, SettingsDiffer) and settings.frozen
    return frozen and (isinstance(seen, ParametersUnused)
                       or (isinstance(seen, RankFailed) and bool(seen.reduction_error)))


EXPLAINS = (
    # Ranks train with different settings: the divergence that follows is its consequence.
    Explains("settings differ by rank", _follows_settings, cause=lambda f: f.severity == "error", priority=10),
)


def _state(evidence: Evidence, rank: int, step: Step) -> Optional[ConfigState]:
    """The detail behind a step's configuration digest on ``rank``."""
    ev = evidence.ranks.get(rank)
    if not ev or step.config is None:
        return None
    found = None
    for state in ev.of(ConfigState):
        if state.opt == step.opt and state.n <= step.n and state.digest == step.config:
            found = state
    return found


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _modes_text(detail: Optional[dict]) -> str:
    """'Dropout and BatchNorm1d in eval mode', 'train mode' for one DDP module's modes."""
    if not detail:
        return "unknown"
    evals = detail.get("eval") or {}
    if not evals:
        return "train mode"
    sensitive = sorted(t for t in evals if any(s in t for s in SENSITIVE))
    num_eval = sum(evals.values())
    if sensitive:
        text = f"{_join(sensitive)} in eval mode"
    else:
        text = f"{num_eval} module{'s' if num_eval > 1 else ''} ({_join(sorted(evals)[:4])}) in eval mode"
    if num_eval >= detail.get("count", 0) > 0:
        text += " (the whole model)"
    return text


def _frozen_text(detail: Optional[dict]) -> str:
    if not detail:
        return "unknown"
    frozen = detail.get("frozen", 0)
    if not frozen:
        return "no parameter frozen"
    names = ", ".join(f"`{n}`" for n in detail.get("names", [])[:4])
    return f"{frozen} of {detail.get('count', 0)} parameters frozen ({names}{', ...' if detail.get('more') else ''})"


def _autocast_text(value: Optional[list]) -> str:
    if not value:
        return "unknown"
    enabled, dtype = value[0], value[1] if len(value) > 1 else ""
    return f"autocast on ({str(dtype).replace('torch.', '')})" if enabled else "autocast off"


def _ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0, 1, 2', 'ranks 0-511, 513-1023': runs of consecutive ranks as ranges."""
    if len(ranks) <= 6:
        return fmt_ranks(ranks)
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return "ranks " + ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _per_group(groups: list[list[int]], texts: dict[int, str]) -> str:
    return "; ".join(f"{_ranks(g)}: {texts[g[0]]}" for g in groups)


def _differences(groups: list[list[int]], states: dict[int, Optional[ConfigState]], opt: int) -> list[dict]:
    """What differs between the rank groups, each with every group's value: [{what, key, text, values}]."""
    reps = [g[0] for g in groups]
    out: list[dict] = []

    def add(what: str, key: str, label: str, values: dict[int, str]) -> None:
        if len(set(values.values())) > 1:
            out.append({"what": what, "key": key, "label": label,
                        "values": {str(r): values[r] for r in reps}, "text": _per_group(groups, values)})

    known = {r: s for r, s in ((r, states.get(r)) for r in reps) if s is not None}
    if len(known) < len(reps):
        return out
    ddps = sorted({k for s in known.values() for k in (*s.modules, *s.frozen, *s.autocast)}, key=int)
    for ddp in ddps:
        suffix = "" if ddp == "0" else f" of DDP module {ddp}"
        add("modes", ddp, f"module modes{suffix}", {r: _modes_text(s.modules.get(ddp)) for r, s in known.items()})
        if len({(s.modules.get(ddp) or {}).get("count") for s in known.values()}) > 1:
            add("structure", ddp, f"number of modules{suffix}",
                {r: f"{(s.modules.get(ddp) or {}).get('count')} modules" for r, s in known.items()})
        add("frozen", ddp, f"requires_grad{suffix}", {r: _frozen_text(s.frozen.get(ddp)) for r, s in known.items()})
        add("autocast", ddp, f"autocast at the forward{suffix}",
            {r: _autocast_text(s.autocast.get(ddp)) for r, s in known.items()})
    num_groups = max(len(s.groups) for s in known.values())
    for index in range(num_groups):
        keys = sorted({k for s in known.values() if index < len(s.groups) for k in s.groups[index]})
        for key in keys:
            raw = {r: s.groups[index].get(key, "absent") if index < len(s.groups) else "no such group"
                   for r, s in known.items()}
            group = "" if num_groups == 1 else f" of param group {index}"
            add("hyperparameter", f"{index}:{key}", f"`{key}`{group}", _shown(raw))
    add("scale", "scale", "GradScaler's scale", _shown({r: s.scale for r, s in known.items()}))
    if not out:  # the digests differ in something the detail does not show (e.g. modes of unnamed modules)
        add("digest", "digest", "configuration", {r: known[r].digest for r in reps})
    return out


def _shown(raw: dict[int, object]) -> dict[int, str]:
    """Values as text, floats rounded unless the rounding would hide their difference."""
    short = {r: (f"{v:.6g}" if isinstance(v, float) else str(v)) for r, v in raw.items()}
    if len(set(short.values())) < len({repr(v) for v in raw.values()}):
        return {r: repr(v) for r, v in raw.items()}
    return short


def _mode_site(evidence: Evidence, groups: list[list[int]], states: dict, ddp: str,
               n: int) -> tuple[Optional[Location], Optional[dict]]:
    """The train()/eval() call that put the ranks with modules in eval mode there, before step n."""
    for group in groups:
        rank = group[0]
        state = states.get(rank)
        if state is None or not (state.modules.get(ddp) or {}).get("eval"):
            continue
        calls = [e for e in evidence.ranks[rank].of(ModeChange)
                 if not e.training and str(e.ddp) == ddp and e.step < n]  # n: the step's process-wide count
        if calls:
            call = calls[-1]
            location = Location.from_site(call.site)
            return location, {"rank": rank, "call": f"{call.type_name}.eval()" if call.name in ("", None) else
                              f"{call.name}.eval()", "at": location.to_json() if location else None,
                              "after_step": call.step}
    return None, None


def _write_site(evidence: Evidence, groups: list[list[int]], opt: int, key: str,
                n: int) -> tuple[Optional[Location], Optional[dict]]:
    """The write of a param-group value that some ranks made and the others did not, before step n."""
    index, _, name = key.partition(":")
    per_rank = {}
    for group in groups:
        rank = group[0]
        per_rank[rank] = [w for w in evidence.ranks[rank].of(ParamGroupsWrite)
                          if w.opt == opt and w.n <= n and [int(index), name] in w.keys]
    sites = {r: {tuple((s["file"], s["line"]) for s in w.sites) for w in writes} for r, writes in per_rank.items()}
    for rank, writes in per_rank.items():
        mine = [w for w in writes if any(tuple((s["file"], s["line"]) for s in w.sites) not in sites[o]
                                         for o in sites if o != rank)]
        if mine and mine[-1].sites:
            write = mine[-1]
            location = Location.from_site(write.sites)
            return location, {"rank": rank, "via": write.via, "at": location.to_json() if location else None,
                              "candidates": write.sites, "before_step": write.n}
    return None, None


@dataclass(frozen=True)
class ConfigDivergence:
    """The first sampled optimizer step at which ranks' configuration digests differ."""

    step: int
    optimizer: int
    groups: list[list[int]]  # ranks grouped by digest, largest group first
    events: dict[int, Step]  # rank -> Step
    last_identical_step: Optional[int] = None


def _ddp_optimizers(evidence: Evidence) -> set[tuple[int, int]]:
    """(rank, optimizer) pairs whose optimizer steps parameters of a DDP module."""
    return {(rank, e.opt) for rank, e in evidence.events(OptimizerInfo) if any(e.in_ddp)}


def config_divergence(evidence: Evidence) -> tuple[Optional[ConfigDivergence], int]:
    """The first sampled step of an optimizer of a DDP module at which ranks' configuration
    digests differ, and how many steps were compared (strings, as the fingerprints are)."""
    trained = _ddp_optimizers(evidence)
    untrained = {(rank, e.opt) for rank, e in evidence.events(OptimizerInfo)} - trained
    steps, _, without_config = facts.steps.sampled(evidence)
    num_compared = 0
    last_identical: dict[int, int] = {}
    for (n, opt), sampled in steps.items():
        events = sampled
        if without_config or untrained:  # the common case, every step of DDP optimizers digested, skips this
            events = {r: e for r, e in sampled.items() if e.config is not None and (r, opt) in trained}
        if len(events) < 2:
            continue
        num_compared += 1
        reference = events[min(events)].config
        if all(e.config == reference for e in events.values()):
            last_identical[opt] = n
            continue
        by_digest: dict[str, list[int]] = {}
        for rank in sorted(events):
            by_digest.setdefault(events[rank].config, []).append(rank)
        groups = sorted(by_digest.values(), key=lambda g: (-len(g), g[0]))
        return ConfigDivergence(n, opt, groups, events, last_identical.get(opt)), num_compared
    return None, num_compared


def analyze(evidence: Evidence) -> CheckResult:
    if evidence.world_size < 2:
        return CheckResult(summary="single process: nothing to compare", applicable=False)
    sharded = sharded_skip(evidence)
    if sharded is not None:
        return sharded
    restored = _state_restored_on_some_ranks(evidence)
    if restored is not None:  # the settings that differ too (a `fused` flag the checkpoint brought) follow from it
        return CheckResult(findings=[restored], summary=f"an optimizer's state was restored on "
                                                        f"{_ranks(restored.evidence.restored_on)} only")
    div, num_compared = config_divergence(evidence)
    if num_compared == 0:
        return CheckResult(summary="no optimizer step of a DDP model was seen on two ranks", applicable=False)
    every = facts.steps.fingerprint_every(evidence)
    sampled = "" if every == 1 else f" (fingerprinted {describe(every)})"
    if div is None:
        return CheckResult(summary=f"same modes, requires_grad, optimizer settings, autocast and loss scale on every "
                                   f"rank at {num_compared} compared steps{sampled}")
    return CheckResult(findings=[_finding(evidence, div)],
                       summary=f"ranks train with different settings from step {div.step} "
                               f"({_ranks([r for g in div.groups for r in g])}){sampled}")


def _state_text(info: OptimizerInfo) -> str:
    if not info.state_entries:
        return "an empty state: step 0, no moments"
    step = f"at step {info.state_step:g}" if info.state_step is not None else "with its buffers"
    return f"{info.type_name} {step}, state for {info.state_entries} parameters"


def _state_restored_on_some_ranks(evidence: Evidence) -> Optional[Finding]:
    """A resume that restored an optimizer's state (`load_state_dict`) on some ranks only, leaving the
    ranks' states different at its first step: the same averaged gradients then move the replicas by
    different amounts (Adam's moments and step count, SGD's momentum)."""
    first: dict[int, dict[int, OptimizerInfo]] = {}
    for rank in sorted(evidence.ranks):
        for info in evidence.ranks[rank].of(OptimizerInfo):
            first.setdefault(info.opt, {}).setdefault(rank, info)
    for opt, infos in sorted(first.items()):
        if len(infos) < 2:
            continue
        restored = sorted(r for r, i in infos.items() if i.loaded_at)
        if not restored or len(restored) == len(infos):
            continue
        if len({(i.state_entries, i.state_step) for i in infos.values()}) < 2:
            continue  # the others got the same state another way (broadcast by hand)
        fresh = sorted(r for r in infos if r not in restored)
        loader = infos[restored[0]]
        location = Location.from_site(loader.loaded_at)
        built = Location.from_site(loader.built_at or loader.site)
        name = (f"the {loader.type_name} built at {short_site(built)}" if built
                else f"optimizer {opt} ({loader.type_name})")
        message = (f"{name} starts from different states on different ranks: "
                   f"{_ranks(restored)} restored it with `load_state_dict` at {short_site(location)} "
                   f"({_state_text(loader)}), {_ranks(fresh)} did not ({_state_text(infos[fresh[0]])}), so the same "
                   f"averaged gradients move the replicas by different amounts from the first step")
        fix = ("Restore the optimizer's state on every rank: call `optimizer.load_state_dict(checkpoint[...])` outside "
               "any `if rank == 0:` (each rank reads the checkpoint, with `map_location` to its own device), as the "
               "model's weights are.")
        return Finding(check=ID, severity="error", message=message, fix=fix, ranks=tuple(sorted(infos)),
                       location=location,
                       evidence=StateRestored(optimizer=opt, step=1, restored_on=restored, not_restored_on=fresh,
                                              restored_at=location.to_json() if location else None,
                                              state={str(r): _state_text(i) for r, i in sorted(infos.items())}))
    return None


def _finding(evidence: Evidence, div: ConfigDivergence) -> Finding:
    states = {r: _state(evidence, r, div.events[r]) for g in div.groups for r in g[:1]}
    diffs = _differences(div.groups, states, div.optimizer)
    info = facts.steps.optimizer_info(evidence, div.groups[0][0], div.optimizer, div.step)
    optimizer = f"optimizer {div.optimizer}" + (f" ({info.type_name})" if info and info.type_name else "")
    location, changed = None, None
    first = diffs[0] if diffs else None
    kinds = {d["what"] for d in diffs}
    if first is not None and first["what"] == "modes":
        location, changed = _mode_site(evidence, div.groups, states, first["key"],
                                       max(div.events[g[0]].step for g in div.groups))
    hyper = next((d for d in diffs if d["what"] == "hyperparameter"), None)
    if location is None and hyper is not None:
        location, changed = _write_site(evidence, div.groups, div.optimizer, hyper["key"], div.step)
        if location is None and info is not None:
            location = Location.from_site(info.built_at or info.site)
            changed = {"optimizer_built_at": location.to_json() if location else None}
    ranks = tuple(sorted(r for g in div.groups for r in g))
    what = "; ".join(f"{d['label']}: {d['text']}" for d in diffs[:3]) if diffs else "their configuration digests differ"
    message = f"the ranks train with different settings from optimizer step {div.step} ({optimizer}): {what}"
    if changed and changed.get("call"):
        message += (f"; rank {changed['rank']} switched to eval mode at {short_site(location)} "
                    f"after step {changed['after_step']} and never back")
    elif changed and changed.get("candidates"):
        how = "an LR scheduler's step" if changed["via"] == "scheduler" else "a write to `param_groups`"
        message += (f"; rank {changed['rank']} changed it by {how} at {short_site(location)} "
                    f"before step {changed['before_step']}, the other ranks did not")
    elif changed and changed.get("optimizer_built_at"):
        message += f"; the values differ since the optimizer was built ({short_site(location)})"
    fix = _fix(kinds)
    evidence_out = SettingsDiffer(what=[f"{d['label']}: {d['text']}" for d in diffs], step=div.step,
                                  optimizer=div.optimizer, changed_by=changed,
                                  last_identical_step=div.last_identical_step, rank_groups=div.groups, differs=diffs)
    return Finding(check=ID, severity="error", message=message, fix=fix, ranks=ranks, location=location,
                   evidence=evidence_out)


def _fix(kinds: set[str]) -> str:
    fixes = []
    if "modes" in kinds:
        fixes.append("Put every rank in the same mode: call `model.train()` at the start of each epoch on every rank, "
                     "and after a rank-0-only evaluation switch that rank back with `model.train()`.")
    if "hyperparameter" in kinds or "scale" in kinds:
        fixes.append("Give every rank the same optimizer settings: step LR schedulers and write `param_groups` on "
                     "every rank (keep `if rank == 0:` around logging only), and compute values such as "
                     "ReduceLROnPlateau's metric from all ranks (all_reduce it).")
    if "frozen" in kinds:
        fixes.append("Freeze and unfreeze parameters on every rank at the same step (`requires_grad_` outside "
                     "rank-dependent branches).")
    if "autocast" in kinds:
        fixes.append("Run the DDP forward under the same autocast settings on every rank.")
    if "structure" in kinds:
        fixes.append("Build the same model on every rank before wrapping it in DDP.")
    return " ".join(fixes) or "Make every rank build and configure the model and the optimizer identically."


CHECK = Check(id=ID, title="same network and settings on every rank", analyze=analyze, docs=DOCS, order=130,
              probes=('optimizer', 'config', 'sharding'),
              evidence=(StateRestored, SettingsDiffer), explains=EXPLAINS)
