"""The report model: the JSON contract (schema ddpdoctor.report/1), consequences, --fail-on."""

from __future__ import annotations

import json

import pytest
from builders import SCRIPT, ddp_wrap, init_pg, make_evidence, process_start

from ddpdoctor.analysis.api import CheckResult, Consequence, Finding, Location
from ddpdoctor.analysis.report import SCHEMA, Report, write_json
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import Analysis, CheckOutcome

TOP_LEVEL = {"schema", "version", "script", "argv", "world_size", "nnodes", "backend", "device", "outcome",
             "duration_s", "checks", "findings"}
FINDING_KEYS = {"check", "severity", "message", "ranks", "location", "evidence", "fix", "consequences"}


def finding(severity, check="gradient-sync", **kwargs):
    return Finding(check=check, severity=severity, message=f"{severity} message", fix="do this", **kwargs)


def analysis():
    error = finding("error", ranks=(1, 0), location=Location(SCRIPT, 30), evidence={"step": 3},
                    consequences=(Consequence(check="buffer-sync", message="buffers differ", ranks=(0, 1)),))
    outcomes = [
        CheckOutcome(id="gradient-sync", title="g", status="fail", summary="replicas diverge",
                     result=CheckResult(findings=[error], summary="replicas diverge")),
        CheckOutcome(id="set-epoch", title="s", status="skip", summary="nothing",
                     result=CheckResult(summary="nothing", applicable=False)),
        CheckOutcome(id="sampler-disjoint", title="d", status="pass", summary="disjoint",
                     result=CheckResult(findings=[finding("info", check="sampler-disjoint")], summary="disjoint")),
        CheckOutcome(id="boom", title="b", status="skip", summary="check crashed", error="RuntimeError: kaput",
                     result=CheckResult(findings=[finding("warning", check="boom")], summary="check crashed",
                                        applicable=False)),
    ]
    return Analysis(outcomes=outcomes, probe_errors=[],
                    findings=[error, finding("warning", check="boom"), finding("info", check="sampler-disjoint")])


def report(evidence=None) -> Report:
    if evidence is None:
        evidence = make_evidence(2, [init_pg(2, backend="gloo"), ddp_wrap(device="cpu")], outcome="failed")
    return build_report(evidence, analysis(), version="0.2.0", script=SCRIPT, argv=["--epochs", "2"],
                        duration_s=12.34567)


def test_report_has_every_contract_key_with_values():
    rep = report().to_json()
    assert TOP_LEVEL <= set(rep)
    assert rep["schema"] == SCHEMA == "ddpdoctor.report/1"
    assert rep["version"] == "0.2.0"
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
    checks = report().to_json()["checks"]
    assert [{k: c[k] for k in ("id", "status", "summary")} for c in checks] == [
        {"id": "gradient-sync", "status": "fail", "summary": "replicas diverge"},
        {"id": "set-epoch", "status": "skip", "summary": "nothing"},
        {"id": "sampler-disjoint", "status": "pass", "summary": "disjoint"},
        {"id": "boom", "status": "skip", "summary": "check crashed"},
    ]
    assert "error" not in checks[0]
    assert checks[3]["error"] == "RuntimeError: kaput"


def test_findings_carry_their_consequences():
    findings = report().to_json()["findings"]
    assert [f["severity"] for f in findings] == ["error", "warning", "info"]
    for f in findings:
        assert set(f) == FINDING_KEYS
    first = findings[0]
    assert first == {"check": "gradient-sync", "severity": "error", "message": "error message", "ranks": [0, 1],
                     "location": {"file": SCRIPT, "line": 30}, "evidence": {"step": 3}, "fix": "do this",
                     "consequences": [{"check": "buffer-sync", "message": "buffers differ", "ranks": [0, 1],
                                       "location": None, "evidence": {}, "severity": "error"}]}
    assert findings[1]["location"] is None and findings[1]["consequences"] == []


def test_backend_and_device_from_the_events():
    evidence = make_evidence(2, {0: [init_pg(2, backend="nccl"), ddp_wrap(device="cuda:0")],
                                 1: [init_pg(2, backend="nccl"), ddp_wrap(device="cuda:1")]})
    rep = report(evidence).to_json()
    assert rep["backend"] == "nccl"
    assert rep["device"] == "cuda"


def test_backend_none_and_device_cpu_without_process_group_or_ddp():
    rep = report(make_evidence(2, [process_start()])).to_json()
    assert rep["backend"] == "none"
    assert rep["device"] == "cpu"
    assert rep["outcome"] == "completed"


def test_ranks_and_nodes():
    evidence = make_evidence(2, [init_pg(2)], nnodes=2)
    evidence.ranks[0].node_rank, evidence.ranks[1].node_rank = 0, 1
    rep = report(evidence).to_json()
    assert rep["nnodes"] == 2
    assert rep["nodes"] == [0, 1]
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]


def test_write_json_round_trips(tmp_path):
    rep = report()
    path = tmp_path / "out" / "report.json"
    write_json(rep, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(rep.to_json()))
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp file left behind


# -- exit code ---------------------------------------------------------------------------------------

def with_findings(*severities) -> Report:
    rep = report()
    rep.findings = [finding(s) for s in severities]
    return rep


@pytest.mark.parametrize("severities, fail_on, expected", [
    ([], "error", 0), ([], "warning", 0), ([], "info", 0),
    (["info"], "error", 0), (["info"], "warning", 0), (["info"], "info", 1),
    (["warning"], "error", 0), (["warning"], "warning", 1), (["warning"], "info", 1),
    (["error"], "error", 1), (["error"], "warning", 1), (["error"], "info", 1),
    (["info", "warning"], "error", 0), (["info", "info", "error"], "error", 1),
])
def test_exit_code_fail_on(severities, fail_on, expected):
    assert with_findings(*severities).exit_code(fail_on) == expected


def test_consequences_never_change_the_exit_code():
    rep = report()
    rep.findings = [finding("info", consequences=(Consequence(check="rank-failure", message="crashed"),))]
    assert rep.exit_code("warning") == 0
