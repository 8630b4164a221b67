"""The JSON report contract (schema ddpdoctor.report/1) and the --fail-on exit code."""

from __future__ import annotations

import json

import pytest
from builders import SCRIPT, ddp_wrap, event, init_pg, make_evidence

from ddpdoctor.analysis import CheckOutcome
from ddpdoctor.check_api import CheckResult, Finding, Location
from ddpdoctor.report import SCHEMA, build_report, exit_code, write_json

TOP_LEVEL = {"schema", "version", "script", "argv", "world_size", "nnodes", "backend", "device", "outcome",
             "duration_s", "checks", "findings"}
FINDING_KEYS = {"check", "severity", "message", "ranks", "location", "evidence", "fix"}


def finding(severity, check="gradient-sync", **kwargs):
    return Finding(check=check, severity=severity, message=f"{severity} message", fix="do this", **kwargs)


def outcomes():
    return [
        CheckOutcome(id="gradient-sync", title="g", result=CheckResult(
            findings=[finding("error", ranks=(1, 0), location=Location(SCRIPT, 30), evidence={"step": 3})],
            summary="replicas diverge")),
        CheckOutcome(id="set-epoch", title="s", result=CheckResult(summary="nothing", applicable=False)),
        CheckOutcome(id="sampler-disjoint", title="d", result=CheckResult(
            findings=[finding("info", check="sampler-disjoint")], summary="disjoint")),
        CheckOutcome(id="boom", title="b", result=CheckResult(
            findings=[finding("warning", check="boom")], summary="check crashed", applicable=False),
            error="RuntimeError: kaput"),
    ]


def report(evidence=None, **kwargs):
    if evidence is None:
        evidence = make_evidence(2, [init_pg(2, backend="gloo"), ddp_wrap(device="cpu")], outcome="failed")
    args = dict(version="0.1.0", script=SCRIPT, argv=["--epochs", "2"], evidence=evidence, outcomes=outcomes(),
                duration_s=12.34567, mode="torchrun")
    args.update(kwargs)
    return build_report(**args)


def test_report_has_every_contract_key_with_values():
    rep = report()
    assert TOP_LEVEL <= set(rep)
    assert rep["schema"] == SCHEMA == "ddpdoctor.report/1"
    assert rep["version"] == "0.1.0"
    assert rep["script"] == SCRIPT
    assert rep["argv"] == ["--epochs", "2"]
    assert rep["world_size"] == 2
    assert rep["nnodes"] == 1
    assert rep["backend"] == "gloo"
    assert rep["device"] == "cpu"
    assert rep["outcome"] == "failed"
    assert rep["duration_s"] == 12.346
    json.loads(json.dumps(rep))  # plain JSON all the way down


def test_checks_carry_id_status_summary_and_error_only_when_crashed():
    checks = report()["checks"]
    assert [{k: c[k] for k in ("id", "status", "summary")} for c in checks] == [
        {"id": "gradient-sync", "status": "fail", "summary": "replicas diverge"},
        {"id": "set-epoch", "status": "skip", "summary": "nothing"},
        {"id": "sampler-disjoint", "status": "pass", "summary": "disjoint"},
        {"id": "boom", "status": "skip", "summary": "check crashed"},
    ]
    assert "error" not in checks[0]
    assert checks[3]["error"] == "RuntimeError: kaput"


def test_findings_are_serialized_most_severe_first():
    findings = report()["findings"]
    assert [f["severity"] for f in findings] == ["error", "warning", "info"]
    for f in findings:
        assert set(f) == FINDING_KEYS
    first = findings[0]
    assert first == {"check": "gradient-sync", "severity": "error", "message": "error message", "ranks": [0, 1],
                     "location": {"file": SCRIPT, "line": 30}, "evidence": {"step": 3}, "fix": "do this"}
    assert findings[1]["location"] is None


def test_backend_and_device_from_the_events():
    evidence = make_evidence(2, {0: [init_pg(2, backend="nccl"), ddp_wrap(device="cuda:0")],
                                 1: [init_pg(2, backend="nccl"), ddp_wrap(device="cuda:1")]})
    rep = report(evidence)
    assert rep["backend"] == "nccl"
    assert rep["device"] == "cuda"


def test_backend_none_and_device_cpu_without_process_group_or_ddp():
    rep = report(make_evidence(2, [event("process_start")]))
    assert rep["backend"] == "none"
    assert rep["device"] == "cpu"
    assert rep["outcome"] == "completed"


def test_ranks_and_nodes():
    evidence = make_evidence(2, [init_pg(2)], nnodes=2)
    evidence.ranks[0].node_rank, evidence.ranks[1].node_rank = 0, 1
    rep = report(evidence)
    assert rep["nnodes"] == 2
    assert rep["nodes"] == [0, 1]
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]


def test_write_json_round_trips(tmp_path):
    rep = report()
    path = tmp_path / "out" / "report.json"
    write_json(rep, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(rep))
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp file left behind


# -- exit code ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("severities, fail_on, expected", [
    ([], "error", 0), ([], "warning", 0), ([], "info", 0),
    (["info"], "error", 0), (["info"], "warning", 0), (["info"], "info", 1),
    (["warning"], "error", 0), (["warning"], "warning", 1), (["warning"], "info", 1),
    (["error"], "error", 1), (["error"], "warning", 1), (["error"], "info", 1),
    (["info", "warning"], "error", 0), (["info", "info", "error"], "error", 1),
])
def test_exit_code_fail_on(severities, fail_on, expected):
    assert exit_code([finding(s) for s in severities], fail_on) == expected
