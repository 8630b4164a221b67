"""CI gating: bounded runs, report formats from a real run, selection and configuration,
inline suppression, `ddpdoctor report`, --exit-zero."""

from __future__ import annotations

import importlib.util

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, ddpdoctor_command, skip_or_fail_in_ci

pytestmark = pytest.mark.integration

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "sarif-schema-2.1.0.json"


def ddpdoctor(*args: str, cwd, env=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1", **(env or {})})


# -- bounded runs -----------------------------------------------------------------------------------

def test_max_steps_cuts_a_long_job_cleanly_on_every_rank(run_check):
    run = run_check(None, "--max-steps", "5", script_args=("--epochs", "20"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["cut"] == {"reason": "max-steps", "at": 5}
    assert run.found() == set(), run.findings()
    checks = {c["id"]: c for c in run.report["checks"]}
    assert checks["gradient-sync"]["summary"].startswith("replicas identical after 5 compared steps")
    assert "cut on purpose" in run.output
    assert run.left_behind() == [], "the reference job removes its temporary checkpoint directory when cut"


def test_max_epochs_cuts_at_the_start_of_the_next_training_pass(run_check):
    run = run_check(None, "--max-epochs", "1", script_args=("--epochs", "5", "--num-samples", "512"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["cut"] == {"reason": "max-epochs", "at": 1}
    assert "[rank0] epoch 0:" in run.output and "[rank0] epoch 1:" not in run.output
    assert run.left_behind() == []


# -- formats from a real run of a known-bad fixture -----------------------------------------------------

def test_every_format_from_one_run_of_a_known_bad_fixture(tmp_path):
    if importlib.util.find_spec("jsonschema") is None:
        skip_or_fail_in_ci("jsonschema is not installed (it is in the test extras: pip install -e '.[test]')")
    import jsonschema
    summary = tmp_path / "summary.md"
    out = {name: tmp_path / name for name in ("r.json", "junit.xml", "out.sarif", "report.md")}
    proc = subprocess.run(
        ddpdoctor_command(FIXTURES / "bad_grad_bypass_batchnorm.py", out["r.json"], "--junit", str(out["junit.xml"]),
                          "--sarif", str(out["out.sarif"]), "--markdown", str(out["report.md"]), "--github"),
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_COLOR": "1", "GITHUB_STEP_SUMMARY": str(summary),
             "GITHUB_WORKSPACE": str(FIXTURES.parent)})
    assert proc.returncode == 1, proc.stdout[-3000:]

    suite = ET.parse(out["junit.xml"]).getroot()
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    report = json.loads(out["r.json"].read_text())
    assert len(cases) == len(report["checks"]) == 15 and cases["gradient-sync"].find("failure") is not None
    assert "buffer-sync" in cases["gradient-sync"].findtext("system-out")  # the consequence, shown under it
    assert cases["buffer-sync"].find("failure") is None
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["world_size"] == "2" and properties["backend"] == "gloo" and properties["torch_version"]

    sarif = json.loads(out["out.sarif"].read_text())
    jsonschema.validate(sarif, json.loads(SCHEMA.read_text()))
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "gradient-sync" and result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "fixtures/bad_grad_bypass_batchnorm.py"
    assert result["relatedLocations"] and result["partialFingerprints"]

    lines = proc.stdout.splitlines()
    annotations = [line for line in lines if line.startswith("::error ")]
    assert annotations and "file=fixtures/bad_grad_bypass_batchnorm.py,line=" in annotations[0]
    assert "ddpdoctor gradient-sync" in annotations[0]
    assert "| gradient-sync |" in summary.read_text() or "gradient-sync" in summary.read_text()
    assert out["report.md"].read_text() in summary.read_text()


def _edited_copy(tmp_path: Path, fixture: str, name: str, old: str, new: str) -> Path:
    """A copy of ``fixture`` in ``tmp_path`` as ``name``, its first ``old`` replaced by ``new`` (which
    must happen), beside the _synthetic.py it imports."""
    source = (FIXTURES / fixture).read_text()
    assert old in source, f"{old!r} not in {fixture}"
    script = tmp_path / name
    script.write_text(source.replace(old, new, 1))
    shutil.copy(FIXTURES / "_synthetic.py", tmp_path / "_synthetic.py")
    return script


def test_the_scripts_own_output_cannot_inject_annotations(tmp_path):
    script = _edited_copy(tmp_path, "good_batchnorm.py", "inject.py", "def main() -> None:\n",
                          "def main() -> None:\n    print('::error file=x.py,line=1::injected', flush=True)\n")
    proc = subprocess.run(ddpdoctor_command(script, tmp_path / "r.json", "--github"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "NO_COLOR": "1"})
    lines = proc.stdout.splitlines()
    stop = next(i for i, line in enumerate(lines) if line.startswith("::stop-commands::"))
    token = lines[stop].split("::")[2]
    resume = lines.index(f"::{token}::")
    injected = [i for i, line in enumerate(lines) if "::error file=x.py" in line]
    assert injected and all(stop < i < resume for i in injected), "only while GitHub ignores commands"
    assert not [line for line in lines[resume:] if line.startswith("::error")], "a clean run annotates nothing"


# -- selection, configuration, suppression ------------------------------------------------------------

def test_pyproject_defaults_apply_and_the_command_line_wins(tmp_path):
    """One run: the file's ``quiet`` applies (no option says otherwise) while the command line's
    ``--ignore`` replaces the file's. Every other pairing is in tests/unit/test_project_config.py."""
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\nignore = ["set-epoch"]\nquiet = true\n')
    said = "the script says hello"  # the script's own output, which quiet hides
    _edited_copy(tmp_path, "bad_set_epoch.py", "train.py", "    setup()\n",
                 f"    setup()\n    print({said!r}, flush=True)\n")
    proc = ddpdoctor("check", "train.py", "--json", "r.json", "--plain", "--ignore", "rank0-checkpoint",
                     "--exit-zero", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert said not in proc.stdout  # quiet, from the file
    report = json.loads((tmp_path / "r.json").read_text())
    assert [f["check"] for f in report["findings"]] == ["set-epoch"]  # the CLI's --ignore replaced the file's
    assert "rank0-checkpoint" not in [c["id"] for c in report["checks"]]


@pytest.mark.parametrize("setup, args, fragment", [
    (None, ["--select", "gradient-sink"], "unknown check id 'gradient-sink'"),
    (None, ["--ignore", "set-epoch,nope"], "unknown check id 'nope'"),
    ("[tool.ddpdoctor]\nhang-timeoutt = 3\n", [], "unknown key 'hang-timeoutt'"),
    ("[tool.ddpdoctor]\nfail-on = 'sometimes'\n", [], "fail-on must be one of"),
    (None, ["--max-steps", "0"], "--max-steps must be at least 1"),
])
def test_bad_selection_or_configuration_is_exit_2(tmp_path, setup, args, fragment):
    if setup:
        (tmp_path / "pyproject.toml").write_text(setup)
    proc = ddpdoctor("check", str(FIXTURES / "bad_set_epoch.py"), *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_inline_suppression_is_shown_and_a_stale_one_reported(tmp_path):
    source = (FIXTURES / "bad_set_epoch.py").read_text()
    flagged = "    loader = DataLoader(data, batch_size=64, sampler=sampler)\n"
    source = source.replace(flagged, flagged.rstrip("\n") + "  # ddpdoctor: ignore[set-epoch] same order on purpose\n")
    source = source.replace("    setup()\n", "    setup()  # ddpdoctor: ignore[rank-failure] nothing here\n")
    (tmp_path / "train.py").write_text(source)
    shutil.copy(FIXTURES / "_synthetic.py", tmp_path / "_synthetic.py")
    proc = ddpdoctor("check", "train.py", "--json", "r.json", "--plain", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["findings"] == []
    (suppressed,) = report["suppressed"]
    assert suppressed["finding"]["check"] == "set-epoch" and suppressed["reason"] == "same order on purpose"
    (stale,) = report["unused_suppressions"]
    assert stale["checks"] == ["rank-failure"]
    assert "suppressed" in proc.stdout and "matched nothing" in proc.stdout


def test_a_saved_report_renders_again_in_any_format(tmp_path, run_check):
    run = run_check("bad_set_epoch.py")
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(run.report))
    proc = ddpdoctor("report", str(saved), "--plain", "--junit", str(tmp_path / "j.xml"), cwd=tmp_path)
    assert proc.returncode == 1
    assert "WARNING set-epoch" in proc.stdout and "verdict: NOT OK" in proc.stdout
    assert ET.parse(tmp_path / "j.xml").getroot().find(".//testcase[@name='set-epoch']") is not None
    assert ddpdoctor("report", str(tmp_path / "missing.json"), cwd=tmp_path).returncode == 2


def test_a_missing_real_dependency_skips_here_and_fails_under_ci(monkeypatch):
    """Slurm, network namespaces and the test extras are required where CI is set (.ci/run sets it)."""
    for value in ("true", "1", "yes"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match="required under CI"):
            skip_or_fail_in_ci("no Slurm here: slurmctld not found")
    for value in ("", "false", "0"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.skip.Exception, match="no Slurm here"):
            skip_or_fail_in_ci("no Slurm here: slurmctld not found")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        skip_or_fail_in_ci("no Slurm here: slurmctld not found")
