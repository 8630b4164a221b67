"""The JSON report of every shipped fixture, replayed offline: the analysis must give the same report
on the same evidence as the build that recorded it (the JSON contract in design.md, unchanged).

Each file in tests/data/golden/ holds one fixture run's whole analysis input (every process's evidence
lines, the observations, the checks, the suppressions) and the JSON report that build gave, recorded with
DDPDOCTOR_CAPTURE_DIR while the integration tests ran (see tests/data/golden/README.md). Replaying it
needs no processes, so the whole contract is checked in seconds, deterministically: a finding that
depends on timing was already decided in the evidence.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from ddpdoctor.analysis.evidence import Evidence, parse_lines
from ddpdoctor.analysis.registry import load_checks
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.analysis.suppression import Suppression
from ddpdoctor.schema.observations import Observations

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
ROOT = str(Path(__file__).resolve().parents[2])
ROOT_MARK = "@ROOT@"  # the recording checkout's path, replaced by this checkout's
RUN_SPECIFIC = {"duration_s", "version"}  # the run's own time and the build's version


def _captures() -> list[Path]:
    return sorted(GOLDEN.glob("*.json.gz"))


def _load(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.loads(f.read().replace(ROOT_MARK, ROOT))


def replay(record: dict) -> dict:
    """The JSON report this build gives on the recorded input."""
    checks = {c.id: c for c in load_checks()}
    selected = [checks[i] for i in record["checks"]]
    pool: dict[str, str] = {}
    evidence = Evidence.from_processes((parse_lines(lines, pool) for lines in record["processes"]),
                                       observations=Observations.from_json(record["observations"]),
                                       script=record["script"])
    suppressions = [Suppression(file=s["file"], line=s["line"], checks=tuple(s["checks"]), reason=s["reason"])
                    for s in record["suppressions"]]
    analysis = analyze(evidence, selected, suppressions=suppressions)
    report = build_report(evidence, analysis, version="", script=None if record["is_reference"] else record["script"],
                          argv=record["argv"], duration_s=0.0)
    return report.to_json()


def normalized(report: dict) -> dict:
    """The report without what differs from run to run by design: its duration and the build's version.
    Source excerpts are compared for the fixtures only: a test's temporary copies cannot be read again,
    and ddpdoctor's own files (a frame in the device simulation) change with the code."""
    out = {k: v for k, v in report.items() if k not in RUN_SPECIFIC}
    if isinstance(out.get("sources"), dict):
        fixtures = os.path.join(ROOT, "fixtures") + os.sep
        out["sources"] = {f: lines for f, lines in out["sources"].items() if f.startswith(fixtures)}
    return out


def test_there_are_golden_reports():
    assert len(_captures()) >= 100, "tests/data/golden/ lost its recorded reports"


@pytest.mark.parametrize("path", _captures(), ids=lambda p: p.name.split(".json")[0])
def test_the_report_is_unchanged(path: Path):
    record = _load(path)
    assert normalized(replay(record)) == normalized(record["report"])
