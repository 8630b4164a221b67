"""Third-party checks end to end: the example plugin (tests/plugin_example) and a package of broken
plugins are pip-installed into temporary directories that only the ddpdoctor subprocesses see (on
PYTHONPATH), so nothing is installed into the test environment itself."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES, CheckRun

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[1] / "plugin_example"
EXAMPLE_ID = "example-optimizer-count"
BUILTIN_COUNT = 15

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "ddpdoctor-broken-plugins"
version = "0.1.0"

[project.entry-points."ddpdoctor.checks"]
broken-import = "ddpdoctor_broken_import:CHECK"
wrong-name = "ddpdoctor_broken_checks:MISNAMED"
failing-probe = "ddpdoctor_broken_checks:FAILING_PROBE"

[tool.setuptools]
py-modules = ["ddpdoctor_broken_import", "ddpdoctor_broken_checks"]
"""

BROKEN_IMPORT = 'raise RuntimeError("this plugin is broken on purpose")\n'

BROKEN_CHECKS = """\
from ddpdoctor.plugin import Check, CheckResult


def install(rec):
    raise RuntimeError("this probe is broken on purpose")


MISNAMED = Check(id="right-name", title="Misnamed", docs="", analyze=lambda evidence: CheckResult(summary="ran"))
FAILING_PROBE = Check(id="failing-probe", title="Failing probe", docs="",
                      analyze=lambda evidence: CheckResult(summary="ran"), probe="ddpdoctor_broken_checks:install")
"""


def pip_install(source: Path, target: Path) -> Path:
    """Install ``source`` into ``target`` from a copy, so the build leaves nothing in the repository."""
    build = target.parent / f"{source.name}-build"
    shutil.copytree(source, build)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(build)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.insert(4, "--no-build-isolation")  # offline: build with the setuptools already here
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return target


@pytest.fixture(scope="module")
def plugin_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plugins")
    broken_source = root / "broken"
    broken_source.mkdir()
    (broken_source / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken_source / "ddpdoctor_broken_import.py").write_text(BROKEN_IMPORT)
    (broken_source / "ddpdoctor_broken_checks.py").write_text(BROKEN_CHECKS)
    return {"example": pip_install(EXAMPLE, root / "example"),
            "broken": pip_install(broken_source, root / "broken-target")}


def ddpdoctor(cwd: Path, *args: str, plugins: tuple[Path, ...], disable: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([*map(str, plugins), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("DDPDOCTOR_DISABLE_PLUGINS", None)
    if disable:
        env["DDPDOCTOR_DISABLE_PLUGINS"] = "1"
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


_RUNS: dict[tuple, CheckRun] = {}


@pytest.fixture
def check_with(plugin_dirs, tmp_path):
    """check_with(*plugin names, disable=False): ``ddpdoctor check good_batchnorm.py``, one run per setup."""

    def run(*names: str, disable: bool = False) -> CheckRun:
        key = (names, disable)
        if key not in _RUNS:
            report_path = tmp_path / "report.json"
            proc = ddpdoctor(tmp_path, "check", str(FIXTURES / "good_batchnorm.py"), "--json", str(report_path),
                             "--plain", plugins=tuple(plugin_dirs[n] for n in names), disable=disable)
            report = json.loads(report_path.read_text()) if report_path.exists() else None
            _RUNS[key] = CheckRun(proc.returncode, proc.stdout + proc.stderr, report, 0.0)
        return _RUNS[key]

    return run


def status(run: CheckRun, check_id: str) -> Optional[dict]:
    return next((c for c in run.report["checks"] if c["id"] == check_id), None)


def test_list_checks_lists_the_plugin_after_the_builtins(plugin_dirs, tmp_path):
    proc = ddpdoctor(tmp_path, "list-checks", plugins=(plugin_dirs["example"],))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == BUILTIN_COUNT + 1
    assert lines[-1].startswith(EXAMPLE_ID) and "Optimizer steps per rank (example plugin)" in lines[-1]
    explained = ddpdoctor(tmp_path, "explain", EXAMPLE_ID, plugins=(plugin_dirs["example"],))
    for section in ("## What it does", "## Why it matters", "## Example", "## Use instead"):
        assert section in explained.stdout


def test_the_plugin_probe_runs_in_every_rank_and_its_check_reports_the_counts(check_with):
    """Read from the run beside the broken plugins (test_broken_plugins_...): a working plugin's report
    must not depend on its neighbours, and one run serves both tests."""
    run = check_with("example", "broken")
    assert run.report["outcome"] == "completed", run.output
    assert status(run, EXAMPLE_ID) == {"id": EXAMPLE_ID, "title": "Optimizer steps per rank (example plugin)",
                                       "status": "pass", "summary": "8 optimizer steps on every rank"}
    # good_batchnorm: 512 samples, 2 ranks, batches of 64, 2 epochs -> 8 steps per rank
    assert [(f["severity"], f["message"], f["ranks"]) for f in run.findings(EXAMPLE_ID)] == [
        ("info", "8 optimizer steps on rank 0", [0]), ("info", "8 optimizer steps on rank 1", [1])]
    assert [e["probe"] for e in run.report["probe_errors"]] == ["failing-probe"]  # the broken plugin's, alone


def test_disable_plugins_runs_the_builtin_checks_only(plugin_dirs, check_with, tmp_path):
    listed = ddpdoctor(tmp_path, "list-checks", plugins=(plugin_dirs["example"], plugin_dirs["broken"]), disable=True)
    assert len(listed.stdout.splitlines()) == BUILTIN_COUNT
    assert EXAMPLE_ID not in listed.stdout and "broken" not in listed.stdout
    run = check_with("example", "broken", disable=True)
    assert run.returncode == 0, run.output
    assert len(run.report["checks"]) == BUILTIN_COUNT
    assert run.findings() == [] and run.report["probe_errors"] == []  # no plugin probe was installed either


def test_broken_plugins_are_reported_and_the_run_still_completes(plugin_dirs, check_with, tmp_path):
    listed = ddpdoctor(tmp_path, "list-checks", plugins=(plugin_dirs["example"], plugin_dirs["broken"]))
    assert listed.returncode == 0, listed.stderr
    assert "(failed to load: RuntimeError: this plugin is broken on purpose)" in listed.stdout
    assert "(failed to load: entry point 'wrong-name' differs from the check's id 'right-name'" in listed.stdout

    run = check_with("example", "broken")
    assert run.returncode == 1, run.output  # a broken check is a warning
    assert run.report["outcome"] == "completed"
    assert status(run, "broken-import")["status"] == "skip"
    assert status(run, "wrong-name")["status"] == "skip"
    assert {f["check"] for f in run.serious()} == {"broken-import", "wrong-name"}
    # the probe that failed to install is recorded under its check, which alone is incomplete
    assert status(run, "failing-probe") == {"id": "failing-probe", "title": "Failing probe", "status": "pass",
                                            "summary": "ran", "incomplete": ["failing-probe"]}
    (probe_error,) = run.report["probe_errors"]
    assert probe_error["probe"] == "failing-probe" and probe_error["checks"] == ["failing-probe"]
    assert probe_error["phase"] == "install" and probe_error["ranks"] == [0, 1]
    assert "RuntimeError: this probe is broken on purpose" in probe_error["error"]
    assert [c["id"] for c in run.report["checks"] if c.get("incomplete")] == ["failing-probe"]
    # the script and the working plugin were unaffected
    assert status(run, EXAMPLE_ID)["summary"] == "8 optimizer steps on every rank"
    assert status(run, "gradient-sync")["status"] == "pass"


def test_the_python_api_loads_plugin_events_typed(plugin_dirs, tmp_path):
    code = ("from ddpdoctor import RunConfig, run\n"
            f"report = run(RunConfig(script={str(FIXTURES / 'good_batchnorm.py')!r}))\n"
            f"print(next(c.summary for c in report.checks if c.id == {EXAMPLE_ID!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_dirs["example"]), "PYTHONWARNINGS": "ignore"}
    env.pop("DDPDOCTOR_DISABLE_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.stdout.strip().splitlines()[-1] == "8 optimizer steps on every rank", proc.stdout + proc.stderr
