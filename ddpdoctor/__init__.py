"""ddpdoctor: proves a PyTorch DistributedDataParallel job is correct by watching it run.

The public API for check authors is re-exported here; the CLI lives in :mod:`ddpdoctor.cli`.
"""

from ddpdoctor.check_api import Check, CheckResult, Finding, Location, Severity
from ddpdoctor.evidence import Evidence, RankEvidence

__version__ = "0.1.0"

__all__ = [
    "Check",
    "CheckResult",
    "Evidence",
    "Finding",
    "Location",
    "RankEvidence",
    "Severity",
    "__version__",
]
