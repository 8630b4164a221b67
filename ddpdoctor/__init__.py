"""ddpdoctor: proves a PyTorch DistributedDataParallel job is correct by watching it run.

The package has three sides, and the layout shows them:

- ``ddpdoctor.supervisor``: the CLI and the pipeline ``run(config) -> Report``: launch, monitor,
  transports. It never imports torch.
- ``ddpdoctor.rank``: what runs inside the job's processes (bootstrap, probes, recorder, watchdog).
- ``ddpdoctor.analysis``: evidence, derived facts, the check runner, causality, the report model and
  its renderers. Pure: no processes, no torch.

``ddpdoctor.schema`` holds the contracts between them. ``ddpdoctor.postmortem`` is a second evidence
source, for ``ddpdoctor analyze``: it reads what PyTorch and torchrun left behind (flight recorder
dumps, error files, logs) into the same evidence the analysis judges. The public API is re-exported
here and imported lazily, so a rank process pays nothing for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ddpdoctor._version import __version__

_EXPORTS = {
    "run": "ddpdoctor.supervisor.pipeline",
    "RunConfig": "ddpdoctor.supervisor.config",
    "Report": "ddpdoctor.analysis.report",
    "Check": "ddpdoctor.analysis.api",
    "CheckResult": "ddpdoctor.analysis.api",
    "Consequence": "ddpdoctor.analysis.api",
    "Finding": "ddpdoctor.analysis.api",
    "Location": "ddpdoctor.analysis.api",
    "Severity": "ddpdoctor.analysis.api",
    "Evidence": "ddpdoctor.analysis.evidence",
    "RankEvidence": "ddpdoctor.analysis.evidence",
}

# Spelt out (the names of _EXPORTS), so linters and type checkers see the lazy re-exports as public.
__all__ = ["run", "RunConfig", "Report", "Check", "CheckResult", "Consequence", "Finding", "Location", "Severity",
           "Evidence", "RankEvidence", "__version__"]

if TYPE_CHECKING:
    from ddpdoctor.analysis.api import Check, CheckResult, Consequence, Finding, Location, Severity
    from ddpdoctor.analysis.evidence import Evidence, RankEvidence
    from ddpdoctor.analysis.report import Report
    from ddpdoctor.supervisor.config import RunConfig
    from ddpdoctor.supervisor.pipeline import run


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
