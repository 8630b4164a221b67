"""unused-parameters: names parameters that get no gradient and judges find_unused_parameters."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from dataclasses import dataclass

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, Location, evidence_field
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts.failures import REDUCTION_ERRORS, is_reduction_error
from ddpdoctor.analysis.symptoms import Divergence, ParametersUnused, RankFailed, ReplicasDiverged

from . import _frameworks as frameworks
from ._common import fmt_ranks, sharded_skip

ID = "unused-parameters"


DOCS = """\
## What it does
Records, for every DDP-wrapped module, which parameters received a gradient in each synchronized
iteration (a forward through DDP and its backward, as DDP counts them; models with their own
optimizers, as in a GAN, are judged each on their own backward passes), and names those that got
none: always, on some iterations only, or on some ranks only. Then it judges
`find_unused_parameters`:

- **missing** (error): a parameter got no gradient but DDP was built with
  `find_unused_parameters=False`. DDP waits for that gradient forever; the next forward raises
  *"Expected to have finished reduction in the prior iteration before starting a new one"* and
  lists parameter indices. This check gives the names.
- **needless** (warning): `find_unused_parameters=True` but every parameter got a gradient at every
  step: DDP traverses the autograd graph every iteration for nothing.
- parameters that never get a gradient anywhere are dead weight (warning); parameters used only on
  some steps or ranks are why the flag is needed (info).

## Why it matters
The crash comes one iteration after the cause and names no parameter; the needless flag costs
time on every step of a long run.

## Example
```python
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(10, 10)
        self.aux_head = nn.Linear(10, 2)      # never used in forward
    def forward(self, x):
        return self.body(x)
model = DDP(Net())                             # crashes at the 2nd iteration
```

## Use instead
Remove or freeze what forward never uses (`aux_head.requires_grad_(False)`), or, when parts of the
model really are skipped on some steps, `DDP(model, find_unused_parameters=True)`. Leave the flag
off when every parameter is used.
"""


@dataclass(frozen=True)
class Missing(EvidenceRecord, ParametersUnused):
    """Parameters without a gradient in a DDP built with find_unused_parameters=False (DDP's crash)."""

    ddp: int = evidence_field(hidden=True, default=0)
    unused: list[str] = evidence_field(label="unused parameters", unit="names", default_factory=list)
    iterations_without_grad: dict[str, dict[str, int]] = evidence_field(label="iterations without a gradient",
                                                                        default_factory=dict)
    crashed_ranks: list[int] = evidence_field(label="crashed", unit="ranks", default_factory=list)


@dataclass(frozen=True)
class Needless(EvidenceRecord):
    """find_unused_parameters=True where every parameter got a gradient in every iteration."""

    ddp: int = evidence_field(hidden=True, default=0)
    iterations_observed: dict[str, int] = evidence_field(label="iterations observed", default_factory=dict)


@dataclass(frozen=True)
class NeverUsed(EvidenceRecord, ParametersUnused):
    """Parameters that got no gradient on any rank in any iteration: dead weight."""

    ddp: int = evidence_field(hidden=True, default=0)
    never_used: list[str] = evidence_field(label="never used", unit="names", default_factory=list)


@dataclass(frozen=True)
class SometimesUnused(EvidenceRecord, ParametersUnused):
    """Parameters without a gradient on some iterations or ranks only: why the flag is needed."""

    ddp: int = evidence_field(hidden=True, default=0)
    iterations_without_grad: dict[str, dict[str, int]] = evidence_field(label="iterations without a gradient",
                                                                        default_factory=dict)
    iterations_observed: dict[str, int] = evidence_field(label="iterations observed", default_factory=dict)


def _crashes_ddp(finding: Finding) -> bool:
    return finding.severity == "error" and isinstance(finding.evidence, Missing)


def _ddps_reduction_failure(symptom: Finding, _cause: Finding) -> bool:
    """DDP's "Expected to have finished reduction" crash, or the gradients it left unaveraged."""
    seen = symptom.evidence
    return ((isinstance(seen, RankFailed) and bool(seen.reduction_error))
            or (isinstance(seen, ReplicasDiverged) and seen.case == Divergence.REDUCTION_INCOMPLETE))


EXPLAINS = (
    # DDP raised "Expected to have finished reduction": the unused parameters are the cause.
    Explains("unused parameters crash DDP", _ddps_reduction_failure, cause=_crashes_ddp, priority=30),
)


def _names(index_counts: dict, names: list[str]) -> list[str]:
    return [names[i] if i < len(names) else f"param{i}" for i in sorted(index_counts)]


def analyze(evidence: Evidence) -> CheckResult:
    sharded = sharded_skip(evidence)
    if sharded is not None:
        return sharded
    wraps = facts.ddp.wraps(evidence)
    if not wraps:
        return CheckResult(summary="no DDP module", applicable=False)
    crash_ranks = sorted({f.rank for f in facts.failures.rank_failures(evidence)
                          if f.rank is not None and is_reduction_error(f.message)})
    findings: list[Finding] = []
    num_iterations_total = 0
    for ddp_index, per_rank_wrap in sorted(wraps.items()):
        any_wrap = next(iter(per_rank_wrap.values()))
        names: list[str] = any_wrap.params
        tolerant = any_wrap.find_unused_parameters or any_wrap.static_graph
        usage = facts.ddp.usage(evidence).get(ddp_index, {})
        iterations = {r: u.iterations for r, u in usage.items() if u.iterations}
        unused_count: dict[int, dict[int, int]] = defaultdict(dict)  # param -> rank -> iterations without grad
        for rank, u in usage.items():
            for index, count in u.unused.items():
                unused_count[int(index)][rank] = count
        num_iterations_total += sum(iterations.values())
        location = Location.from_site(any_wrap.site)
        ranks = tuple(sorted(per_rank_wrap))
        if not tolerant:
            if unused_count or crash_ranks:
                unused_names = _names(unused_count, names)
                crashed = (f"; DDP then raised \"{REDUCTION_ERRORS[0]}\" on {fmt_ranks(crash_ranks)}" if crash_ranks
                           else "")
                listed = ", ".join(f"`{n}`" for n in unused_names[:10]) or "some parameters"
                findings.append(Finding(
                    check=ID, severity="error", location=location,
                    ranks=tuple(sorted({r for c in unused_count.values() for r in c}) or crash_ranks),
                    message=f"{listed} got no gradient but DDP was built with find_unused_parameters=False{crashed}",
                    fix=frameworks.fix(evidence, "find-unused", (
                        "Use every parameter in the loss, freeze the unused ones with requires_grad_(False) before "
                        "wrapping, or pass find_unused_parameters=True if they are skipped only on some steps.")),
                    evidence=Missing(
                        ddp=ddp_index, unused=unused_names,
                        iterations_without_grad={names[i]: {str(r): c for r, c in sorted(v.items())}
                                                 for i, v in sorted(unused_count.items()) if i < len(names)},
                        crashed_ranks=crash_ranks),
                ))
            continue
        if not iterations or any_wrap.static_graph:
            continue
        if not unused_count:
            findings.append(Finding(
                check=ID, severity="warning", ranks=ranks, location=location,
                message=(f"find_unused_parameters=True but every parameter got a gradient in every observed iteration "
                         f"({sum(iterations.values())} rank-iterations): DDP searches the autograd graph every "
                         "iteration for nothing"),
                fix=frameworks.fix(evidence, "needless-find-unused",
                                   "Drop find_unused_parameters=True from the DistributedDataParallel call."),
                evidence=Needless(ddp=ddp_index,
                                  iterations_observed={str(r): c for r, c in sorted(iterations.items())}),
            ))
            continue
        always = [i for i, c in unused_count.items()
                  if set(c) >= set(iterations) and all(c[r] == iterations[r] for r in iterations)]
        sometimes = [i for i in unused_count if i not in always]
        if always:
            findings.append(Finding(
                check=ID, severity="warning", ranks=ranks, location=location,
                message=(f"{', '.join(f'`{n}`' for n in _names(dict.fromkeys(always), names)[:10])} never got a "
                         "gradient on any rank"),
                fix="Remove these parameters or freeze them with requires_grad_(False) before wrapping with DDP.",
                evidence=NeverUsed(ddp=ddp_index, never_used=_names(dict.fromkeys(always), names)),
            ))
        if sometimes:
            findings.append(Finding(
                check=ID, severity="info", ranks=ranks, location=location,
                message=(f"{', '.join(f'`{n}`' for n in _names(dict.fromkeys(sometimes), names)[:10])} got no gradient "
                         "on some iterations or ranks only: find_unused_parameters=True is needed here"),
                fix="Nothing to do.",
                evidence=SometimesUnused(
                    ddp=ddp_index,
                    iterations_without_grad={names[i]: {str(r): c for r, c in sorted(unused_count[i].items())}
                                             for i in sorted(sometimes) if i < len(names)},
                    iterations_observed={str(r): c for r, c in sorted(iterations.items())}),
            ))
    if not findings:
        if num_iterations_total == 0:
            return CheckResult(summary="no backward pass through DDP observed", applicable=False)
        return CheckResult(summary=f"every parameter got a gradient ({num_iterations_total} rank-iterations observed)")
    return CheckResult(findings=findings, summary=textwrap.shorten(findings[0].message.split(":")[0], 100,
                                                                   placeholder=" …"))


# A saved report's evidence reads back as the first type it fits: Needless's fields are some of SometimesUnused's.
CHECK = Check(id=ID, title="unused parameters", analyze=analyze, docs=DOCS, order=50,
              probes=('ddp', 'optimizer', 'sharding'),
              evidence=(Missing, NeverUsed, Needless, SometimesUnused), explains=EXPLAINS)
