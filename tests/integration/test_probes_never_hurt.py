"""The probes never hurt the patient: the script's tracebacks show only its own frames, unusual
tensors save fine, and a probe that fails is reported with the checks it leaves incomplete while
the script runs on unchanged."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import FIXTURES, ddpdoctor_command

pytestmark = pytest.mark.integration

OUR_FRAMES = ("ddpdoctor/rank/", "ddpdoctor/supervisor/", "runpy")


def _traceback_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip().startswith("[rank") and 'File "' in line]


def test_a_ranks_traceback_shows_the_script_not_ddpdoctor(run_check):
    run = run_check("bad_raise_on_rank1.py")  # the fault matrix's run (test_hangs_and_faults.py)
    frames = _traceback_lines(run.output)
    assert any("bad_raise_on_rank1.py" in line for line in frames), run.output[-3000:]
    assert not [line for line in frames if any(ours in line for ours in OUR_FRAMES)], frames


def test_a_spawned_workers_traceback_shows_the_script_not_ddpdoctor(tmp_path):
    script = tmp_path / "spawn_raise.py"
    source = (FIXTURES / "spawn_reference.py").read_text()
    script.write_text(source.replace("    sampler.set_epoch(0)\n", "    sampler.set_epoch(0)\n"
                                     "    if rank == 1:\n        raise ValueError('bad shard')\n"))
    (tmp_path / "_synthetic.py").write_text((FIXTURES / "_synthetic.py").read_text())
    proc = subprocess.run(ddpdoctor_command(script, tmp_path / "r.json"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert "ValueError: bad shard" in proc.stdout, proc.stdout[-3000:]
    frames = [line for line in proc.stdout.splitlines() if 'File "' in line]
    assert any("spawn_raise.py" in line for line in frames)
    assert not [line for line in frames if any(ours in line for ours in OUR_FRAMES)], frames


def test_saving_tensors_the_probe_cannot_sum_works_and_is_recorded(run_check):
    run = run_check("good_unusual_save.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set() and run.report["probe_errors"] == [], run.findings()
    statuses = {c["id"]: c for c in run.report["checks"]}
    assert statuses["rank0-checkpoint"]["status"] == "pass"
    assert statuses["rank0-checkpoint"]["summary"].startswith("1 save(s), 2 load(s)")


def test_a_failing_probe_is_reported_and_the_script_runs_on(tmp_path):
    """A fault injected into the fingerprint function (through sitecustomize, before the probes
    import it) makes the optimizer and DDP probes fail on every call."""
    (tmp_path / "sitecustomize.py").write_text(
        "import ddpdoctor.rank.fingerprint as fp\n"
        "def broken(tensors, **options):\n    raise RuntimeError('injected fault')\n"
        "fp.start = broken\n")
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NO_COLOR": "1"}
    proc = subprocess.run(ddpdoctor_command(FIXTURES / "reference.py", report, script_args=("--epochs", "1")),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    data = json.loads(report.read_text())
    assert data["outcome"] == "completed", proc.stdout[-3000:]
    assert "done: val_acc=" in proc.stdout, "the script itself ran to its end"
    (problem,) = [p for p in data["probe_errors"] if p["probe"] == "optimizer"]
    assert problem["error"] == "RuntimeError: injected fault" and problem["ranks"] == [0, 1]
    checks = {c["id"]: c for c in data["checks"]}
    assert "optimizer" in checks["gradient-sync"]["incomplete"]
    assert checks["uneven-inputs"]["status"] == "pass", "steps are still counted without fingerprints"
    assert "probe optimizer failed" in proc.stdout
