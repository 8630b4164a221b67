"""Each known-bad fixture is caught with its check id; each known-good fixture stays clean.

Real torchrun, 2 gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration

# fixture -> {check id: severity} that must be reported (more findings may accompany them).
KNOWN_BAD = {
    "bad_grad_no_ddp.py": {"gradient-sync": "error", "not-distributed": "warning"},
    "bad_grad_bypass.py": {"gradient-sync": "error"},
    "bad_grad_step_in_no_sync.py": {"gradient-sync": "error"},
    "bad_params_modified.py": {"gradient-sync": "error"},
    "bad_buffer_sync.py": {"buffer-sync": "warning"},
    "bad_sampler_no_distributed.py": {"sampler-disjoint": "error"},
    "bad_sampler_rank_seed.py": {"sampler-disjoint": "error"},
    "bad_sampler_wrong_replicas.py": {"sampler-disjoint": "error"},
    "bad_sampler_batch_sampler_workers.py": {"sampler-disjoint": "error"},
    "bad_set_epoch.py": {"set-epoch": "warning"},
    "bad_unused_missing.py": {"unused-parameters": "error", "rank-failure": "error"},
    "bad_unused_needless.py": {"unused-parameters": "warning"},
    "bad_no_process_group.py": {"not-distributed": "error"},
}

GRADIENT_CASES = {
    "bad_grad_no_ddp.py": "not-wrapped",
    "bad_grad_bypass.py": "ddp-bypassed",
    "bad_grad_step_in_no_sync.py": "step-in-no-sync",
    "bad_params_modified.py": "params-modified",
}

KNOWN_GOOD = [
    "good_no_sync_accumulation.py",
    "good_rank_seeded_init.py",
    "good_dropout.py",
    "good_allreduce_metrics.py",
    "good_unused_sometimes.py",
    "good_batchnorm.py",
]


@pytest.mark.parametrize("fixture", sorted(KNOWN_BAD))
def test_known_bad_fixture_is_reported(run_check, fixture):
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.returncode == 1, run.output
    severities = run.severities()
    for check_id, severity in KNOWN_BAD[fixture].items():
        assert severity in severities.get(check_id, set()), (check_id, severities, run.output[-3000:])
    statuses = {c["id"]: c["status"] for c in run.report["checks"]}
    for check_id, severity in KNOWN_BAD[fixture].items():
        assert statuses[check_id] == ("fail" if severity == "error" else "warn")


@pytest.mark.parametrize("fixture", sorted(GRADIENT_CASES))
def test_gradient_sync_names_the_case_step_and_parameter(run_check, fixture):
    run = run_check(fixture)
    (finding,) = run.findings("gradient-sync")
    assert finding["evidence"]["case"] == GRADIENT_CASES[fixture]
    assert finding["evidence"]["step"] >= 1
    assert finding["evidence"]["parameter"]
    assert finding["ranks"] == [0, 1]
    assert finding["location"] is not None and finding["location"]["file"].startswith(str(FIXTURES))


@pytest.mark.parametrize("fixture", KNOWN_GOOD)
def test_known_good_fixture_is_clean(run_check, fixture):
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.serious() == [], run.serious()
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"


def test_unused_missing_names_the_parameter(run_check):
    run = run_check("bad_unused_missing.py")
    (finding,) = run.findings("unused-parameters", "error")
    assert any("head" in name for name in finding["evidence"]["unused"]), finding
    assert finding["evidence"]["crashed_ranks"], finding


def test_crash_names_rank_exception_and_line(run_check):
    run = run_check("bad_raise_on_rank1.py", "--hang-timeout", "5")
    assert run.returncode == 1
    (finding,) = run.findings("rank-failure", "error")
    assert finding["ranks"] == [1]
    assert "ValueError" in finding["message"] and "bad batch" in finding["message"]
    assert finding["location"]["file"].endswith("bad_raise_on_rank1.py")
    assert finding["location"]["line"] == _line_of("bad_raise_on_rank1.py", 'raise ValueError("bad batch")')


def _line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")
