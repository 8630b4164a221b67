"""The one pipeline: run(config) -> Report from Python, the supervisor side without torch, and the
same diagnosis whether ddpdoctor launches the job or runs inside an existing torchrun launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import FIXTURES, ddpdoctors_own

pytestmark = pytest.mark.integration


def test_run_returns_a_report_without_importing_torch_or_leaving_state(tmp_path):
    """The supervisor and analysis sides import no torch, even while running a whole job, and
    run() neither exits the interpreter nor leaves threads, handlers or files behind."""
    program = textwrap.dedent(f"""
        import importlib, json, os, pkgutil, signal, sys, tempfile, threading
        import ddpdoctor.analysis, ddpdoctor.schema, ddpdoctor.supervisor
        for package in (ddpdoctor.supervisor, ddpdoctor.analysis, ddpdoctor.schema):
            for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(module.name)
        from ddpdoctor.analysis.registry import load_checks
        assert all(c.check is not None for c in load_checks())
        imported_before = "torch" in sys.modules
        handlers = {{s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}}
        temp_before = set(os.listdir(tempfile.gettempdir()))
        from ddpdoctor import RunConfig, run
        report = run(RunConfig(script={str(FIXTURES / "bad_set_epoch.py")!r}))
        print(json.dumps({{
            "torch_before": imported_before, "torch_after": "torch" in sys.modules,
            "outcome": report.outcome, "exit_code": report.exit_code("warning"),
            "findings": [f.check for f in report.findings], "threads": threading.active_count(),
            "handlers_kept": handlers == {{s: signal.getsignal(s) for s in handlers}},
            "new_temp": sorted(n for n in set(os.listdir(tempfile.gettempdir())) - temp_before
                               if n.startswith("ddpdoctor-")),
        }}))
    """)
    private_tmp = tmp_path / "tmp"  # other jobs on this machine make their own ddpdoctor-* directories in /tmp
    private_tmp.mkdir()
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(private_tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"torch_before": False, "torch_after": False, "outcome": "completed", "exit_code": 1,
                      "findings": ["set-epoch"], "threads": 1, "handlers_kept": True, "new_temp": []}


def _diagnosis(report: dict) -> dict:
    """What must not depend on the launch mode: statuses, root causes and their consequences."""
    return {
        "outcome": report["outcome"],
        "checks": {c["id"]: c["status"] for c in report["checks"]},
        "findings": sorted((f["check"], f["severity"], json.dumps(f["location"]), tuple(f["ranks"]),
                            tuple(sorted(c["check"] for c in f["consequences"]))) for f in report["findings"]),
    }


@pytest.mark.parametrize("fixture, options", [
    ("good_batchnorm.py", ()),
    ("bad_grad_bypass_batchnorm.py", ()),
    ("hang_barrier_rank0.py", ("--hang-timeout", "5")),
])
def test_the_same_diagnosis_inside_an_existing_torchrun_launch(run_check, run_inside_launch, fixture, options):
    launched = run_check(fixture, *options)
    inside_run = run_inside_launch(fixture, *options)
    inside = inside_run.report
    assert inside["launch_mode"] == "existing-launch" and launched.report["launch_mode"] == "torchrun"
    ours = ddpdoctors_own(inside_run.temp_left)
    assert ours == [], f"ddpdoctor inside a launch leaves none of its temporary folders, hung or not: {ours}"
    assert _diagnosis(inside) == _diagnosis(launched.report)
