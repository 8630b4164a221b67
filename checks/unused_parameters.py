"""unused-parameters: names parameters that get no gradient and judges find_unused_parameters."""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.check_api import Check, CheckResult, Finding, Location
from ddpdoctor.evidence import Evidence

from ._common import fmt_ranks

ID = "unused-parameters"

REDUCTION_ERROR = "Expected to have finished reduction in the prior iteration"

DOCS = """\
## What it does
Records, for every DDP-wrapped module, which parameters received a gradient between two optimizer
steps (over all micro-batches), and names those that got none: always, on some steps only, or on
some ranks only. Then it judges `find_unused_parameters`:

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


def analyze(evidence: Evidence) -> CheckResult:
    wraps = {}
    for rank, event in evidence.events("ddp_wrap"):
        wraps.setdefault(event["ddp"], {})[rank] = event
    if not wraps:
        return CheckResult(summary="no DDP module", applicable=False)
    crash_ranks = sorted({r for r, e in evidence.events("exception") if REDUCTION_ERROR in e.get("message", "")})
    findings: list[Finding] = []
    num_windows_total = 0
    for ddp_index, per_rank_wrap in sorted(wraps.items()):
        any_wrap = next(iter(per_rank_wrap.values()))
        names: list[str] = any_wrap["params"]
        tolerant = any_wrap.get("find_unused_parameters") or any_wrap.get("static_graph")
        unused_count: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # param -> rank -> count
        windows: dict[int, int] = defaultdict(int)
        for rank, event in evidence.events("step"):
            window = (event.get("ddp") or {}).get(str(ddp_index)) or (event.get("ddp") or {}).get(ddp_index)
            if not window or window.get("unused") is None:
                continue
            windows[rank] += 1
            for i in window["unused"]:
                unused_count[i][rank] += 1
        num_windows = sum(windows.values())
        num_windows_total += num_windows
        location = Location.from_site(any_wrap.get("site"))
        ranks = tuple(sorted(per_rank_wrap))
        if not tolerant:
            if unused_count or crash_ranks:
                unused_names = [names[i] for i in sorted(unused_count)]
                crashed = f"; DDP then raised \"{REDUCTION_ERROR}\" on {fmt_ranks(crash_ranks)}" if crash_ranks else ""
                listed = ", ".join(f"`{n}`" for n in unused_names[:10]) or "some parameters"
                findings.append(Finding(
                    check=ID, severity="error", ranks=tuple(sorted({r for c in unused_count.values() for r in c}) or crash_ranks),
                    location=location,
                    message=(f"{listed} got no gradient but DDP was built with find_unused_parameters=False{crashed}"),
                    fix=("Use every parameter in the loss, freeze the unused ones with requires_grad_(False) before "
                         "wrapping, or pass find_unused_parameters=True if they are skipped only on some steps."),
                    evidence={"ddp": ddp_index, "unused": unused_names,
                              "steps_without_grad": {names[i]: dict(sorted((str(r), c) for r, c in v.items()))
                                                     for i, v in sorted(unused_count.items())},
                              "crashed_ranks": crash_ranks},
                ))
            continue
        if num_windows == 0 or any_wrap.get("static_graph"):
            continue
        if not unused_count:
            findings.append(Finding(
                check=ID, severity="warning", ranks=ranks, location=location,
                message=(f"find_unused_parameters=True but every parameter got a gradient in every observed step "
                         f"({num_windows} rank-steps): DDP searches the autograd graph every iteration for nothing"),
                fix="Drop find_unused_parameters=True from the DistributedDataParallel call.",
                evidence={"ddp": ddp_index, "steps_observed": dict((str(r), c) for r, c in sorted(windows.items()))},
            ))
            continue
        always = [i for i, c in unused_count.items() if len(c) == len(windows) and all(c[r] == windows[r] for r in windows)]
        sometimes = [i for i in unused_count if i not in always]
        if always:
            findings.append(Finding(
                check=ID, severity="warning", ranks=ranks, location=location,
                message=f"{', '.join(f'`{names[i]}`' for i in sorted(always)[:10])} never got a gradient on any rank",
                fix="Remove these parameters or freeze them with requires_grad_(False) before wrapping with DDP.",
                evidence={"ddp": ddp_index, "never_used": [names[i] for i in sorted(always)]},
            ))
        if sometimes:
            findings.append(Finding(
                check=ID, severity="info", ranks=ranks, location=location,
                message=(f"{', '.join(f'`{names[i]}`' for i in sorted(sometimes)[:10])} got no gradient on some steps "
                         "or ranks only: find_unused_parameters=True is needed here"),
                fix="Nothing to do.",
                evidence={"ddp": ddp_index,
                          "steps_without_grad": {names[i]: dict(sorted((str(r), c) for r, c in unused_count[i].items()))
                                                 for i in sorted(sometimes)},
                          "steps_observed": dict((str(r), c) for r, c in sorted(windows.items()))},
            ))
    if not findings:
        if num_windows_total == 0:
            return CheckResult(summary="no optimizer step after a forward through DDP", applicable=False)
        return CheckResult(summary=f"every parameter got a gradient ({num_windows_total} rank-steps observed)")
    return CheckResult(findings=findings, summary=findings[0].message.split(":")[0][:100])


CHECK = Check(id=ID, title="unused parameters", analyze=analyze, docs=DOCS)
