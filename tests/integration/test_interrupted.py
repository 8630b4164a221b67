"""Stop signals: Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM end a run with
outcome "interrupted", exit code 128+signal, no finding drawn from what the stop cut off, and no
process left behind (the autouse fixture in conftest.py checks that after every test)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
from conftest import FIXTURES, ddpdoctor_command

pytestmark = pytest.mark.integration


def _start(cmd: list[str], tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` in its own process group (like a job in a terminal), with a private TMPDIR
    so that this test sees only its own run's evidence directory."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return proc, tmpdir


def _wait(proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            output = proc.communicate()[0] if proc.poll() is not None else ""
            proc.kill()
            raise AssertionError(f"the run never got ready (exit code {proc.poll()}): {output[-3000:]}")
        time.sleep(0.05)


def _heartbeats(tmpdir: Path) -> dict[int, dict]:
    beats = {}
    for path in glob.glob(str(tmpdir / "ddpdoctor-*" / "hb-*.json")):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if data.get("rank") is not None:
            beats[data["rank"]] = data
    return beats


def _finish(proc: subprocess.Popen, json_path: Path) -> tuple[int, str, Optional[dict]]:
    output, _ = proc.communicate(timeout=120)
    report = json.loads(json_path.read_text()) if json_path.exists() else None
    return proc.returncode, output, report


def _assert_interrupted(report: dict, signal_name: str) -> None:
    assert report["outcome"] == "interrupted"
    assert report["findings"] == [], report["findings"]
    assert report["interruption"]["signal"] == signal_name
    assert report["interruption"]["exit_code"] == 128 + signal.Signals[signal_name]
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses["rank-failure"] == "pass" and statuses["uneven-inputs"] in ("pass", "skip"), statuses


def test_ctrl_c_on_a_stuck_job_says_where_each_rank_was(tmp_path):
    """Ctrl-C before the hang timeout: no hang is claimed from the stall, but the report shows rank 0
    waiting in the barrier of validate() and rank 1 in DDP's gradient all-reduce, and the collective
    both ranks made differently before the signal is still the root cause."""
    json_path = tmp_path / "report.json"
    proc, tmpdir = _start(ddpdoctor_command(FIXTURES / "hang_barrier_rank0.py", json_path), tmp_path)
    # Both ranks past the first epoch's two steps: rank 0 waits in validate()'s barrier, rank 1 in the
    # next backward. Heartbeats stop changing there; one more second makes sure both are inside.
    _wait(proc, lambda: len(beats := _heartbeats(tmpdir)) == 2 and all(b["steps"] >= 2 for b in beats.values()))
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    code, output, report = _finish(proc, json_path)
    assert code == 130, output[-3000:]  # interrupted: 130, whatever was found before the signal
    (finding,) = report["findings"]
    assert finding["check"] == "collective-hang" and "differs across ranks" in finding["message"]
    assert finding["location"]["line"] == 16  # validate()'s barrier that only rank 0 calls
    report["findings"] = []
    _assert_interrupted(report, "SIGINT")
    ranks = report["interruption"]["ranks"]
    assert ranks["0"]["state"] == "waiting" and ranks["0"]["where"]["function"] == "validate", ranks
    assert "all-reduce" in ranks["1"]["waiting_in"], ranks
    assert "interrupted by SIGINT" in output and "where each rank was" in output
    assert "verdict: INTERRUPTED by SIGINT" in output
    assert "Traceback" not in output, output[-3000:]


def test_sigterm_mid_training_leaves_out_the_cut_off_counts(tmp_path):
    """SIGTERM to ddpdoctor alone (kill, a container runtime): ranks stop mid-epoch, at different
    batches and steps, and nothing is concluded from that."""
    json_path = tmp_path / "report.json"
    proc, _ = _start(ddpdoctor_command(None, json_path, script_args=("--epochs", "50", "--no-benchmark")), tmp_path)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the reference job prints one line per epoch on rank 0
        lines.append(line)
        if "[rank0] epoch 2:" in line:
            break
    os.kill(proc.pid, signal.SIGTERM)
    code, output, report = _finish(proc, json_path)
    output = "".join(lines) + output
    assert code == 143, output[-3000:]
    _assert_interrupted(report, "SIGTERM")
    assert report["interruption"]["during"] == "run"
    assert {c["id"]: c["status"] for c in report["checks"]}["sampler-disjoint"] == "pass"  # finished epochs judged


def test_ctrl_c_during_start_up_says_interrupted(tmp_path):
    json_path = tmp_path / "report.json"
    proc, tmpdir = _start(ddpdoctor_command(None, json_path), tmp_path)
    _wait(proc, lambda: bool(glob.glob(str(tmpdir / "ddpdoctor-*"))))  # run() began; no rank has imported torch yet
    os.killpg(proc.pid, signal.SIGINT)
    code, output, report = _finish(proc, json_path)
    assert code == 130, output[-3000:]
    assert "no evidence" not in output
    assert "interrupted by SIGINT during start-up" in output
    assert report["outcome"] == "interrupted" and report["findings"] == []
    assert report["interruption"]["during"] == "start-up"


def test_ctrl_c_inside_an_existing_torchrun_launch(tmp_path):
    """torchrun -m ddpdoctor check: the terminal's SIGINT reaches torchrun and every rank's ddpdoctor
    (torchrun forwards it once more); rank 0 writes one interrupted report."""
    json_path = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "ddpdoctor",
           "check", "--json", str(json_path), "--plain", "--", "--epochs", "50", "--no-benchmark"]
    proc, _ = _start(cmd, tmp_path)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[rank0] epoch 1:" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)
    _, output, report = _finish(proc, json_path)
    output = "".join(lines) + output
    assert report is not None, output[-3000:]
    _assert_interrupted(report, "SIGINT")
    assert report["launch_mode"] == "existing-launch" and report["world_size"] == 2
    assert output.count("verdict:") == 1
    assert "[rank1] Traceback" not in output, output[-3000:]
