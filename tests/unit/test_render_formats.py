"""CI gating formats rendered from reports of synthetic evidence: JUnit, SARIF (validated against the
published 2.1.0 schema), GitHub Actions annotations, Markdown, and the JSON report read back."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import xml.etree.ElementTree as ET

import jsonschema
import pytest
from builders import (SCRIPT, buffers, ddp_wrap, forwards, fp, init_pg, make_evidence, merge, on_all, optimizer,
                      process_start, step)

from ddpdoctor.analysis.api import Consequence, Finding, Location
from ddpdoctor.analysis.registry import find_check
from ddpdoctor.analysis.render import github
from ddpdoctor.analysis.render.junit import render_junit
from ddpdoctor.analysis.render.markdown import render_markdown
from ddpdoctor.analysis.render.sarif import FINGERPRINT_KEY, render_sarif
from ddpdoctor.analysis.report import CheckStatus, Report, write_json
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze

from ddpdoctor.analysis.registry import load_checks

load_checks()  # the checks register their evidence types: a built-in check's dict evidence below is typed as theirs

REPO = "/job"  # SCRIPT is /job/train.py
NAMES = ("fc.weight", "fc.bias")
SCHEMA = json.loads((pathlib.Path(__file__).parents[1] / "data" / "sarif-schema-2.1.0.json").read_text())


def report_of(per_rank: dict, *, buffer_names=()) -> Report:
    setup = on_all(2, process_start(torch_version="2.13.0", python_version="3.12.1"), init_pg(2),
                   ddp_wrap(NAMES, buffers=buffer_names), optimizer(NAMES))
    evidence = make_evidence(2, merge(setup, per_rank))
    return build_report(evidence, analyze(evidence), version="0.2.0", script=SCRIPT, argv=["--epochs", "2"],
                        duration_s=1.5)


def diverged() -> Report:
    """gradient-sync (forward bypassed DDP) explaining buffer-sync's drift as a consequence."""
    bypass = {"0": forwards(synced=0, unsynced=0, inner=1)}
    return report_of({0: [step(1, fp(1.0, 2.0), ddp=bypass), buffers(1, fp(0.0))],
                      1: [step(1, fp(1.0, 2.5), ddp=bypass), buffers(1, fp(0.5))]}, buffer_names=["bn.running_mean"])


def clean() -> Report:
    return report_of({0: [step(1, fp(1.0, 2.0))], 1: [step(1, fp(1.0, 2.0))]})


def with_findings(*findings: Finding) -> Report:
    return dataclasses.replace(clean(), findings=list(findings))


def finding(severity: str, check: str = "rank-failure", **kwargs) -> Finding:
    return Finding(check=check, severity=severity, message=f"{severity} at step 12", fix="do this", **kwargs)


def test_the_synthetic_reports_are_what_the_tests_assume():
    (root,) = diverged().findings
    assert (root.check, root.severity, root.location) == ("gradient-sync", "error", Location(SCRIPT, 30))
    assert [(c.check, c.location) for c in root.consequences] == [("buffer-sync", Location(SCRIPT, 20))]
    assert clean().findings == []
    assert {c.status for c in diverged().checks} == {"fail", "pass", "skip"}


# -- JUnit -------------------------------------------------------------------------------------------

def junit(report: Report, **kwargs) -> ET.Element:
    root = ET.fromstring(render_junit(report, **kwargs))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "ddpdoctor"
    return suite


def cases(suite: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name"): case for case in suite.findall("testcase")}


def test_junit_one_testcase_per_check_and_a_failure_for_the_error():
    report = diverged()
    suite = junit(report)
    by_name = cases(suite)
    assert list(by_name) == [c.id for c in report.checks]
    assert {case.get("classname") for case in by_name.values()} == {"ddpdoctor"}
    failure = by_name["gradient-sync"].find("failure")
    assert failure.get("message") == report.findings[0].message
    assert failure.get("type") == "error"
    assert f"at {SCRIPT}:30" in failure.text and "fix: Call the DDP wrapper itself" in failure.text
    out = by_name["gradient-sync"].find("system-out").text
    assert "ranks: 0, 1" in out and f"location: {SCRIPT}:30" in out and "    compared: gradients" in out
    assert '"case"' not in out and "ddp-bypassed" not in out  # evidence in words, internal codes hidden
    assert "consequence (buffer-sync): buffer `bn.running_mean` differs" in out and f"{SCRIPT}:20" in out
    assert by_name["buffer-sync"].find("failure") is None  # a consequence never fails on its own
    skipped = {name for name, case in by_name.items() if case.find("skipped") is not None}
    assert skipped == {c.id for c in report.checks if c.status == "skip"}
    assert by_name["set-epoch"].find("skipped").get("message") == "no shuffling DistributedSampler iterated twice"
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": str(len(report.checks)), "failures": "1", "errors": "0", "skipped": str(len(skipped)),
        "time": "1.500"}


def test_junit_properties_describe_the_run():
    properties = {p.get("name"): p.get("value") for p in junit(diverged()).find("properties")}
    assert properties == {"world_size": "2", "nnodes": "1", "backend": "gloo", "device": "cpu",
                          "torch_version": "2.13.0", "python_version": "3.12.1", "outcome": "completed",
                          "launch_mode": "torchrun", "ddpdoctor_version": "0.2.0"}


def test_junit_clean_run_has_no_failure():
    suite = junit(clean())
    assert suite.get("failures") == "0"
    assert all(case.find("failure") is None for case in suite.findall("testcase"))


@pytest.mark.parametrize("severity, fail_on, fails", [
    ("error", "error", True), ("error", "warning", True), ("warning", "warning", True), ("warning", "error", False),
    ("info", "warning", False), ("info", "info", True),
])
def test_junit_fails_a_check_like_the_exit_code_does(severity, fail_on, fails):
    report = with_findings(finding(severity))
    suite = junit(report, fail_on=fail_on)
    assert (cases(suite)["rank-failure"].find("failure") is not None) is fails
    assert suite.get("failures") == ("1" if fails else "0")
    assert bool(report.exit_code(fail_on)) is fails
    assert cases(suite)["rank-failure"].find("system-out") is not None  # below the threshold: still shown


def test_junit_a_crashed_check_fails_rather_than_skips_and_says_why():
    report = with_findings(finding("warning", check="boom"))
    report.checks.append(CheckStatus(id="boom", title="b", status="skip", summary="check crashed",
                                     error="RuntimeError: kaput"))
    case = cases(junit(report, fail_on="warning"))["boom"]
    assert case.find("failure") is not None and case.find("skipped") is None
    case = cases(junit(report, fail_on="error"))["boom"]
    assert case.find("skipped").get("message") == "check crashed: RuntimeError: kaput"


def test_junit_a_finding_of_an_unlisted_check_still_gets_a_testcase():
    report = with_findings(finding("error", check="third-party"))
    suite = junit(report)
    assert cases(suite)["third-party"].find("failure") is not None
    assert suite.get("tests") == str(len(report.checks) + 1)


def test_junit_replaces_characters_xml_cannot_carry():
    suite = junit(with_findings(Finding(check="rank-failure", severity="error", message="bad \x1b[31mred\x00",
                                        fix="f")))
    assert cases(suite)["rank-failure"].find("failure").get("message") == "bad \ufffd[31mred\ufffd"


# -- SARIF -------------------------------------------------------------------------------------------

def sarif(report: Report, repo_root: str = REPO) -> dict:
    log = render_sarif(report, repo_root=repo_root)
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)
    return log


def test_the_schema_is_the_published_sarif_2_1_0_schema():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert SCHEMA["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    assert {"$schema", "version", "runs"} <= set(SCHEMA["properties"]) and "Root" not in SCHEMA["definitions"]
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    with pytest.raises(jsonschema.ValidationError):  # it does reject what is not SARIF
        jsonschema.Draft7Validator(SCHEMA).validate({"version": "2.1.0", "runs": [{"results": []}]})


def test_sarif_of_a_divergence():
    log = sarif(diverged())
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json" and log["version"] == "2.1.0"
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert (driver["name"], driver["version"]) == ("ddpdoctor", "0.2.0")
    assert run["originalUriBaseIds"] == {"SRCROOT": {"uri": "file:///job/"}}
    assert run["invocations"] == [{"executionSuccessful": True}]
    (result,) = run["results"]
    rule = driver["rules"][result["ruleIndex"]]
    assert result["ruleId"] == rule["id"] == "gradient-sync"
    docs = find_check("gradient-sync").check
    assert rule["name"] == "GradientSync"
    assert rule["shortDescription"] == {"text": docs.title}
    assert rule["help"] == {"text": docs.docs, "markdown": docs.docs}
    assert rule["fullDescription"]["text"].startswith("Fingerprints every parameter's gradient")
    assert rule["defaultConfiguration"] == {"level": "error"}
    assert result["level"] == "error"
    assert result["message"] == {"text": diverged().findings[0].message}
    assert result["locations"] == [{"physicalLocation": {
        "artifactLocation": {"uri": "train.py", "uriBaseId": "SRCROOT"}, "region": {"startLine": 30}}}]
    (related,) = result["relatedLocations"]
    assert related["physicalLocation"]["region"] == {"startLine": 20}
    assert related["message"]["text"].startswith("consequence (buffer-sync): buffer `bn.running_mean` differs")
    fingerprint = result["partialFingerprints"][FINGERPRINT_KEY]
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert [r["id"] for r in driver["rules"]] == [c.id for c in diverged().checks]


def test_sarif_of_a_clean_run_has_no_results():
    (run,) = sarif(clean())["runs"]
    assert run["results"] == []


def test_sarif_levels_files_outside_the_repo_and_findings_without_a_location():
    report = with_findings(finding("warning", location=Location("/elsewhere/lib.py", 7)), finding("info"),
                           finding("error", check="third-party", location=Location(f"{REPO}/sub dir/a.py", 3)))
    results = sarif(report)["runs"][0]["results"]
    assert [r["level"] for r in results] == ["warning", "note", "error"]
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "file:///elsewhere/lib.py"}
    assert "locations" not in results[1]
    assert results[2]["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "sub%20dir/a.py",
                                                                                  "uriBaseId": "SRCROOT"}
    assert "ruleIndex" in results[2]  # a check missing from the list still gets a rule


def test_sarif_fingerprint_ignores_digits_but_not_the_check_or_place():
    def fingerprint(f: Finding) -> str:
        return sarif(with_findings(f))["runs"][0]["results"][0]["partialFingerprints"][FINGERPRINT_KEY]

    at = Location(f"{REPO}/train.py", 30)
    base = fingerprint(Finding(check="rank-failure", severity="error", message="rank 1 died at step 12", fix="f",
                               location=at))
    assert base == fingerprint(Finding(check="rank-failure", severity="error", message="rank 3 died at step 907",
                                       fix="other", location=at))
    assert base != fingerprint(Finding(check="uneven-inputs", severity="error", message="rank 1 died at step 12",
                                       fix="f", location=at))
    assert base != fingerprint(Finding(check="rank-failure", severity="error", message="rank 1 died at step 12",
                                       fix="f", location=Location(f"{REPO}/train.py", 31)))


# -- GitHub Actions ----------------------------------------------------------------------------------

def test_escaping_follows_the_workflow_command_rules():
    assert github.escape_data("100% done\r\nnext: a,b") == "100%25 done%0D%0Anext: a,b"
    assert github.escape_property("100% done\r\nnext: a,b") == "100%25 done%0D%0Anext%3A a%2Cb"


def test_annotation_of_a_divergence():
    (line,) = github.annotations(diverged(), repo_root=REPO)
    assert line.startswith("::error file=train.py,line=30,title=ddpdoctor gradient-sync::gradients of `fc.bias`")
    assert "%0Aconsequence (buffer-sync): buffer `bn.running_mean` differs" in line
    assert "at train.py:20%0Afix: Call the DDP wrapper itself" in line
    assert "\n" not in line


def test_annotation_commands_and_findings_without_a_location():
    lines = github.annotations(with_findings(finding("warning"), finding("info")), repo_root=REPO)
    assert lines == ["::warning title=ddpdoctor rank-failure::warning at step 12%0Afix: do this",
                     "::notice title=ddpdoctor rank-failure::info at step 12%0Afix: do this"]


def test_a_message_cannot_inject_a_second_command():
    hostile = Finding(check="rank-failure", severity="warning", message="boom\n::error::pwned\r::error::again",
                      fix="f", location=Location(f"{REPO}/a,b:c.py", 4))
    (line,) = github.annotations(with_findings(hostile), repo_root=REPO)
    assert line.splitlines() == [line]
    assert line.startswith("::warning file=a%2Cb%3Ac.py,line=4,title=ddpdoctor rank-failure::boom%0A::error::pwned%0D")


def test_stop_commands_wrap_the_script_output_with_an_unguessable_token():
    token = github.new_stop_token()
    assert token != github.new_stop_token() and len(token) >= 32
    assert github.stop_line(token) == f"::stop-commands::{token}"
    assert github.resume_line(token) == f"::{token}::"


# -- Markdown ----------------------------------------------------------------------------------------

def test_markdown_of_a_divergence():
    report = diverged()
    text = render_markdown(report)
    assert text.splitlines()[0] == "## ❌ ddpdoctor verdict: NOT OK: 1 error(s), 0 warning(s), 0 info"
    assert "| | Check | Summary |\n|---|---|---|\n" in text
    assert "| ❌ | `gradient-sync` | replicas diverge at step 1 (ranks 0, 1) |" in text
    assert "| ➖ | `set-epoch` | no shuffling DistributedSampler iterated twice |" in text
    assert sum(line.startswith("| ") for line in text.splitlines()) == 1 + len(report.checks)
    assert "### ❌ ERROR `gradient-sync`" in text
    assert f"- **Location:** `{SCRIPT}:30`" in text and "- **Ranks:** 0, 1" in text
    assert "- **Fix:** Call the DDP wrapper itself" in text
    assert "- **Consequences:**\n  - `buffer-sync`: buffer `bn.running_mean` differs" in text
    assert f"at `{SCRIPT}:20`" in text


def test_markdown_of_a_clean_run():
    text = render_markdown(clean())
    assert text.startswith("## ✅ ddpdoctor verdict: OK")
    assert "## Findings" not in text and "| ✅ | `gradient-sync` |" in text


def test_markdown_escapes_pipes_in_table_cells():
    report = clean()
    report.checks[0].summary = "a | b\nc"
    row = next(line for line in render_markdown(report).splitlines() if "`gradient-sync`" in line)
    assert row == "| ✅ | `gradient-sync` | a \\| b<br>c |"


# -- the JSON report read back -----------------------------------------------------------------------

def rich_report() -> Report:
    report = diverged()
    report.findings.append(Finding(check="boom", severity="warning", message="crashed", fix="report it",
                                   evidence={"error": "Traceback"}))
    report.checks.append(CheckStatus(id="boom", title="b", status="skip", summary="check crashed", error="E: x",
                                     incomplete=["data"]))
    report.probe_errors.append({"probe": "data", "target": None, "error": "E", "phase": "run", "ranks": [1],
                                "checks": ["boom"]})
    report.missing_ranks.append(3)
    return report


@pytest.mark.parametrize("make", [diverged, clean, rich_report])
def test_from_json_round_trips(make, tmp_path):
    report = make()
    assert Report.from_json(report.to_json()).to_json() == report.to_json()
    path = tmp_path / "report.json"
    write_json(report, str(path))
    again = Report.from_json(json.loads(path.read_text()))
    assert again.to_json() == json.loads(path.read_text())
    assert again.findings == [dataclasses.replace(f, ranks=tuple(sorted(f.ranks))) for f in report.findings]


def test_from_json_ignores_keys_it_does_not_know():
    data = diverged().to_json()
    expected = json.loads(json.dumps(data))
    data["added_later"] = {"x": 1}
    data["checks"][0]["added_later"] = 1
    data["findings"][0]["added_later"] = 1
    data["findings"][0]["consequences"][0]["added_later"] = 1
    assert Report.from_json(data).to_json() == expected


def test_from_json_refuses_another_schema():
    with pytest.raises(ValueError, match="ddpdoctor.report/1"):
        Report.from_json({**clean().to_json(), "schema": "something/2"})


def test_renderers_accept_a_report_read_back():
    report = Report.from_json(json.loads(json.dumps(diverged().to_json())))
    assert render_junit(report) == render_junit(diverged())
    assert render_sarif(report, repo_root=REPO) == render_sarif(diverged(), repo_root=REPO)
    assert render_markdown(report) == render_markdown(diverged())
    assert Consequence.from_json(report.findings[0].consequences[0].to_json()) == report.findings[0].consequences[0]


# -- nested evidence in every renderer ---------------------------------------------------------------

REPR_MARKS = ("{'", "': ", "[{", '{"', '": ', "}]", "'}")


def nested_report() -> Report:
    """Findings whose evidence holds lists of records and nested records: built-in checks' and a plugin's."""
    site = {"file": SCRIPT, "line": 31, "function": "main"}
    moves = Finding(check="gradient-sync", severity="error", message="moved off the GPU and back", fix="wrap after",
                    location=Location(SCRIPT, 31), ranks=(0, 1), evidence={
                        "case": "device-round-trip",
                        "moves": [{"call": ".cpu()", "at": {"file": SCRIPT, "line": 31}, "after_step": 1},
                                  {"call": ".cuda()", "at": {"file": SCRIPT, "line": 34}, "after_step": 1}]})
    config = Finding(check="config-sync", severity="error", message="lr differs", fix="schedule on every rank",
                     ranks=(0, 1), evidence={
                         "what": ["`lr`: rank 0: 0.045; rank 1: 0.05"], "step": 2, "optimizer": 0,
                         "changed_by": {"rank": 0, "via": "scheduler", "at": {"file": SCRIPT, "line": 26},
                                        "candidates": [{**site, "line": 26}], "before_step": 2},
                         "differs": [{"what": "hyperparameter", "key": "0:lr", "label": "`lr`",
                                      "values": {"0": "0.045", "1": "0.05"}, "text": "rank 0: 0.045; rank 1: 0.05"}]})
    plugin = Finding(check="my-plugin", severity="warning", message="layers drift", fix="look", evidence={
        "layers": [{"name": "encoder.0", "norm": 1.5, "ranks": [0], "site": site}],
        "worst": {"layer": "encoder.0", "detail": {"grad_norm": 2.0}}})
    return with_findings(moves, config, plugin)


def rendered_everywhere(report: Report) -> dict[str, str]:
    import io

    from rich.console import Console

    from ddpdoctor.analysis.render.html import render_html
    from ddpdoctor.analysis.render.terminal import render

    out = io.StringIO()
    render(Console(file=out, width=200, no_color=True, soft_wrap=True), report, plain=True)
    sarif_strings = json.dumps([v for run in render_sarif(report, repo_root=REPO)["runs"]
                                for v in _strings(run["results"])])
    return {"terminal": out.getvalue(), "html": render_html(report), "markdown": render_markdown(report),
            "junit": render_junit(report), "sarif": sarif_strings,
            "github": "\n".join(github.annotations(report, repo_root=REPO))}


def _strings(value) -> list[str]:
    """Every string inside a JSON document (SARIF is JSON itself: only its texts are checked)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_no_renderer_prints_a_dict_or_a_list_of_dicts():
    from html import unescape

    outputs = rendered_everywhere(nested_report())
    for name, text in outputs.items():
        if name == "sarif":
            text = "\n".join(json.loads(text))
        text = unescape(text) if name in ("html", "junit") else text
        found = [mark for mark in REPR_MARKS if mark in text]
        assert not found, f"{name} prints raw data {found}"
    for name in ("terminal", "html", "markdown", "junit"):
        text = outputs[name].replace("&#x27;", "'").replace("&#96;", "`")
        assert "`.cpu()` at train.py:31 after step 1" in text, name
        assert "`.cuda()` at train.py:34 after step 1" in text, name
        assert "rank 0: via scheduler at train.py:26 (main) before step 2" in text, name
        assert "ranks 0: encoder.0" not in text and "rank 0: encoder.0 at train.py:31 (main), norm 1.5" in text, name
        assert "encoder.0, detail (grad norm 2)" in text, name
        assert "`lr`: rank 0: 0.045; rank 1: 0.05" in text and "hyperparameter" not in text, name
