"""Slurm as a launcher, against a real one-node Slurm (slurm_cluster.py starts munged, slurmctld and
slurmd as root, installing Debian's packages if needed): `srun -n N ddpdoctor check` is one job of N
ranks, hangs and exit codes reach Slurm, and scancel / time limits end the run as "interrupted"."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, skip_or_fail_in_ci
from slurm_cluster import SlurmCluster, TwoNodeSlurm

pytestmark = pytest.mark.integration

# What must never reach a Slurm user's log after the report: C++ stacks of a store closing under a
# peer, torch's warnings, Python tracebacks of ranks that ddpdoctor stopped.
NOISE = re.compile(r"frame #|TCPStore|recvValue|Traceback|Connection closed|^\[?[WE]\d{4} ", re.M)


@pytest.fixture(scope="session")
def slurm():
    reason = SlurmCluster.unavailable()
    if reason is not None:
        skip_or_fail_in_ci(f"no Slurm here: {reason}")
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# The reference job as short as these tests' assertions need (launch, ranks, hosts, one report): one
# epoch of 1024 samples, no bandwidth sweep (4 ranks share the machine's two cores).
SHORT = ("--", "--epochs", "1", "--num-samples", "1024", "--no-benchmark")


def _doctor(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddpdoctor", "check", *args]


def _srun(slurm, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**slurm.env, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(["srun", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _job_processes(job_id: str) -> list[str]:
    """Live processes of Slurm job ``job_id`` (by SLURM_JOB_ID in their environment)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and "slurmstepd" not in cmdline:
            found.append(f"{entry}: {cmdline}")
    return found


def _job_state(slurm: SlurmCluster, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], env=slurm.env, capture_output=True, text=True).stdout
    match = re.search(r"JobState=(\S+)", out)
    return match.group(1) if match else ""


def _wait_for_job(slurm: SlurmCluster, job_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _job_state(slurm, job_id)
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {_job_state(slurm, job_id)} after {timeout_s:.0f}s")


def _wait_for_line(path: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}: "
                         f"{path.read_text(errors='replace')[-2000:] if path.exists() else ''}")


def _sbatch(slurm: SlurmCluster, tmp_path: Path, body: str, *options: str) -> tuple[str, Path]:
    output = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={output}\n{body}\necho \"srun exit code $?\"\n")
    proc = subprocess.run(["sbatch", "--parsable", *options, str(script)], cwd=tmp_path, env=slurm.env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], output


def _assert_quiet(output: str) -> None:
    after_report = output[output.find("ddpdoctor 0."):]
    noise = NOISE.search(after_report)
    assert noise is None, f"{noise.group(0)!r} after the report:\n{after_report[-3000:]}"


def test_srun_4_tasks_is_one_job_of_4_ranks(slurm, tmp_path):
    """`srun -n 4 ddpdoctor check`: one reference job of 4 ranks, one report, exit 0, no noise."""
    proc = _srun(slurm, tmp_path, "-n", "4", *_doctor("--json", str(tmp_path / "report.json"), "--plain", *SHORT))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert output.count("verdict:") == 1, output[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world_size"] == 4 and report["outcome"] == "completed"
    assert report["launch_mode"] == "existing-launch"
    assert report["launch"]["detected"] == "slurm"
    scheduler = report["launch"]["scheduler"]
    assert scheduler["name"] == "slurm" and scheduler["job_id"].isdigit() and scheduler["step_id"] == "0"
    assert scheduler["nodes"] == [slurm.host] and scheduler["num_tasks"] == 4
    assert [(r["rank"], r["host"], r["local_rank"]) for r in report["ranks"]] == \
        [(r, os.uname().nodename, r) for r in range(4)]
    assert {e["variables"].get("SLURM_JOB_ID") for e in report["environment"]} == {scheduler["job_id"]}
    assert f"launch: Slurm job {scheduler['job_id']}, step 0, 4 task(s) on {slurm.host}" in output
    _assert_quiet(output)
    assert _job_processes(scheduler["job_id"]) == []


def test_srun_hang_names_the_barrier_and_exits_1(slurm, tmp_path):
    fixture = FIXTURES / "hang_barrier_rank0.py"
    proc = _srun(slurm, tmp_path, "-n", "2",
                 *_doctor(str(fixture), "--hang-timeout", "5", "--json", str(tmp_path / "report.json"), "--plain"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["outcome"] == "hung" and report["world_size"] == 2
    (finding,) = [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert finding["check"] == "collective-hang"
    assert finding["location"] == {"file": str(fixture), "line": 16}
    assert finding["evidence"]["ranks"]["0"]["where"]["function"] == "validate"
    assert output.count("verdict:") == 1
    _assert_quiet(output)


def test_srun_torchrun_inside_a_step_is_a_torchrun_launch(slurm, tmp_path):
    """One torchrun per node under srun, the tutorials' pattern: torchrun's variables win."""
    proc = _srun(slurm, tmp_path, "-n", "1", sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", "-m", "ddpdoctor", "check", "--json", str(tmp_path / "report.json"),
                 "--plain", "--", "--epochs", "1", "--no-benchmark")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world_size"] == 2 and report["launch"]["detected"] == "torchrun"
    assert report["launch"]["scheduler"]["num_tasks"] == 1
    assert output.count("verdict:") == 1


def _interrupted_job(slurm, tmp_path, *, script_args: str,
                     sbatch_options: tuple[str, ...] = ()) -> tuple[str, Path, dict]:
    report_path = tmp_path / "report.json"
    job_id, output = _sbatch(
        slurm, tmp_path,
        f"srun {' '.join(_doctor())} --json {report_path} --plain -- {script_args}", "--ntasks=2", *sbatch_options)
    return job_id, output, {"report": report_path}


def test_scancel_interrupts_the_run(slurm, tmp_path):
    """scancel of a running sbatch job: SIGTERM to every task; outcome interrupted, exit 143 on every
    task, no finding, nothing left behind."""
    job_id, output, paths = _interrupted_job(slurm, tmp_path, script_args="--epochs 1000 --no-benchmark")
    _wait_for_line(output, "[rank0] epoch 1:")
    subprocess.run(["scancel", job_id], env=slurm.env, check=True, timeout=30)
    assert _wait_for_job(slurm, job_id, timeout_s=120) == "CANCELLED"
    text = output.read_text(errors="replace")
    report = json.loads(paths["report"].read_text())
    assert report["outcome"] == "interrupted", text[-3000:]
    assert report["findings"] == []
    assert report["interruption"]["signal"] == "SIGTERM" and report["interruption"]["exit_code"] == 143
    assert (re.search(r"tasks? 0-1: Exited with exit code 143", text)
            or text.count("Exited with exit code 143") == 2), text
    _assert_quiet(text)
    assert _job_processes(job_id) == []


def test_srun_signal_usr1_interrupts_the_step(slurm, tmp_path):
    """`scancel --signal=USR1` (what `sbatch --signal=USR1@T` sends before a time limit or preemption)
    reaches the step's tasks: interrupted by SIGUSR1, exit 138; the batch script goes on."""
    job_id, output, paths = _interrupted_job(slurm, tmp_path, script_args="--epochs 1000 --no-benchmark")
    _wait_for_line(output, "[rank0] epoch 1:")
    subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm.env, check=True, timeout=30)
    assert _wait_for_job(slurm, job_id, timeout_s=120) in ("COMPLETED", "FAILED")
    text = output.read_text(errors="replace")
    report = json.loads(paths["report"].read_text())
    assert report["outcome"] == "interrupted" and report["findings"] == [], text[-3000:]
    assert report["interruption"]["signal"] == "SIGUSR1" and report["interruption"]["exit_code"] == 138
    assert "srun exit code 138" in text, text[-2000:]
    assert _job_processes(job_id) == []


def test_time_limit_interrupts_the_run(slurm, tmp_path):
    """A job that runs into its time limit (one minute, Slurm's smallest) ends like scancel: SIGTERM,
    outcome interrupted, state TIMEOUT. The fixture trains slowly so the minute costs no CPU."""
    fixture = FIXTURES / "good_long_run.py"
    report_path = tmp_path / "report.json"
    job_id, output = _sbatch(
        slurm, tmp_path, f"srun {' '.join(_doctor(str(fixture)))} --json {report_path} --plain -- --pause 0.5",
        "--ntasks=2", "--time=1")
    assert _wait_for_job(slurm, job_id, timeout_s=240) == "TIMEOUT"
    text = output.read_text(errors="replace")
    report = json.loads(report_path.read_text())
    assert report["outcome"] == "interrupted", text[-3000:]
    assert report["findings"] == []
    assert report["interruption"]["signal"] == "SIGTERM"
    assert "DUE TO TIME LIMIT" in text
    _assert_quiet(text)
    assert _job_processes(job_id) == []


# -- two Slurm nodes on one machine (network namespaces): the stretch of issue #23 -------------------

@pytest.fixture(scope="module")
def two_nodes(slurm):
    from two_hosts import unavailable

    reason = unavailable()
    if reason is not None:
        skip_or_fail_in_ci(f"no network namespaces here: {reason}")
    cluster = TwoNodeSlurm()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def shared_dir():
    """Where the report goes: outside /tmp, which each node has its own of."""
    path = Path("/run") / f"ddpdoctor-slurm-shared-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_srun_across_two_nodes_is_one_job(two_nodes, shared_dir):
    proc = _srun(two_nodes, shared_dir, "-N", "2", "-n", "4", "--ntasks-per-node=2",
                 *_doctor("--json", str(shared_dir / "report.json"), "--plain", *SHORT))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    report = json.loads((shared_dir / "report.json").read_text())
    assert report["world_size"] == 4 and report["nnodes"] == 2 and report["outcome"] == "completed"
    assert [(r["rank"], r["host"], r["node"]) for r in report["ranks"]] == \
        [(0, "node-1", 0), (1, "node-1", 0), (2, "node-2", 1), (3, "node-2", 1)]
    assert report["launch"]["scheduler"]["nodes"] == ["node-1", "node-2"]
    assert output.count("verdict:") == 1
    _assert_quiet(output)


def test_a_hang_on_the_second_node_is_named_by_its_host(two_nodes, shared_dir):
    proc = _srun(two_nodes, shared_dir, "-N", "2", "-n", "4", "--ntasks-per-node=2",
                 *_doctor(str(FIXTURES / "hang_barrier_last_rank.py"), "--hang-timeout", "5",
                          "--json", str(shared_dir / "report.json"), "--plain"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    report = json.loads((shared_dir / "report.json").read_text())
    assert report["outcome"] == "hung"
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert finding["check"] == "collective-hang"
    assert re.search(r"rank 3 on node-2 waits in barrier #\d+ at hang_barrier_last_rank.py", finding["message"]), \
        finding["message"]
    _assert_quiet(output)
