"""Check discovery through entry points, and the runner's handling of crashing checks."""

from __future__ import annotations

import pytest
from builders import make_evidence

from ddpdoctor.analysis.api import Check, CheckResult, Finding
from ddpdoctor.analysis.registry import LoadedCheck, find_check, load_checks
from ddpdoctor.analysis.runner import analyze


def run_checks(evidence, checks=None):
    return analyze(evidence, checks).outcomes

IDS = ["gradient-sync", "buffer-sync", "sampler-disjoint", "set-epoch", "unused-parameters",
       "collective-hang", "uneven-inputs", "rank0-checkpoint", "rank-failure", "not-distributed",
       "env-consistency", "collective-bandwidth", "config-sync", "optimizer-params"]
SECTIONS = ("What it does", "Why it matters", "Example", "Use instead")


def test_all_ten_builtin_checks_load_through_entry_points_in_order():
    loaded = load_checks()
    assert [c.id for c in loaded][:len(IDS)] == IDS
    for c in loaded[:10]:
        assert c.error is None, c
        assert isinstance(c.check, Check)
        assert c.check.id == c.id
        assert c.check.title


@pytest.mark.parametrize("check_id", IDS)
def test_docs_have_every_section(check_id):
    loaded = find_check(check_id)
    assert loaded is not None and loaded.check is not None
    docs = loaded.check.docs
    assert docs.strip()
    for section in SECTIONS:
        assert f"## {section}" in docs, (check_id, section)
    positions = [docs.index(f"## {s}") for s in SECTIONS]
    assert positions == sorted(positions)


def test_find_check_of_an_unknown_id_is_none():
    assert find_check("no-such-check") is None


def _boom(evidence):
    raise RuntimeError("kaput")


def test_a_crashing_check_is_reported_as_skip_with_a_warning():
    ok = Check(id="fine", title="Fine", docs="", analyze=lambda e: CheckResult(summary="all good"))
    crashing = Check(id="boom", title="Boom", docs="", analyze=_boom)
    outcomes = run_checks(make_evidence(2, []), [LoadedCheck(id="boom", check=crashing),
                                                 LoadedCheck(id="fine", check=ok)])
    assert [o.id for o in outcomes] == ["boom", "fine"]
    boom, fine = outcomes
    assert boom.status == "skip"
    assert boom.title == "Boom"
    assert boom.error == "RuntimeError: kaput"
    assert boom.result.summary == "check crashed"
    (finding,) = boom.result.findings
    assert finding.check == "boom"
    assert finding.severity == "warning"
    assert finding.message == "the boom check itself crashed, so it proved nothing"
    assert "RuntimeError: kaput" in finding.evidence["error"]
    assert fine.status == "pass"
    assert fine.result.summary == "all good"


def test_a_check_that_failed_to_load_is_reported_as_skip_with_a_warning():
    (outcome,) = run_checks(make_evidence(2, []), [LoadedCheck(id="broken", check=None,
                                                               error="ImportError: no module x")])
    assert outcome.status == "skip"
    (finding,) = outcome.result.findings
    assert finding.severity == "warning"
    assert "could not load: ImportError: no module x" in finding.evidence["error"]


def test_builtin_checks_run_on_empty_evidence_without_crashing():
    outcomes = run_checks(make_evidence(2, []))
    assert [o.id for o in outcomes][:len(IDS)] == IDS
    assert all(o.error is None for o in outcomes), [(o.id, o.error) for o in outcomes]


def test_findings_are_ordered_errors_then_warnings_then_info():
    def result_with(*severities):
        return lambda e: CheckResult(findings=[Finding(check="c", severity=s, message=s, fix="") for s in severities])

    checks = [LoadedCheck(id="a", check=Check(id="a", title="a", docs="", analyze=result_with("info", "warning"))),
              LoadedCheck(id="b", check=Check(id="b", title="b", docs="", analyze=result_with("error")))]
    findings = analyze(make_evidence(2, []), checks).findings
    assert [f.severity for f in findings] == ["error", "warning", "info"]


def test_a_failed_probe_marks_the_checks_it_feeds_incomplete():
    from builders import probe_error

    evidence = make_evidence(2, [probe_error("data", target="_BaseDataLoaderIter._next_index", phase="install")])
    analysis = analyze(evidence)
    (problem,) = analysis.probe_errors
    assert problem["probe"] == "data" and problem["ranks"] == [0, 1]
    assert set(problem["checks"]) == {"sampler-disjoint", "set-epoch", "uneven-inputs"}
    incomplete = {o.id for o in analysis.outcomes if o.incomplete}
    assert incomplete == {"sampler-disjoint", "set-epoch", "uneven-inputs"}
