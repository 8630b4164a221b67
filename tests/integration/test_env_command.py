"""`ddpdoctor env` through the same pipeline as `check`, and --min-busbw on the reference job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def ddpdoctor(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "NO_COLOR": "1"})


def test_env_on_two_ranks_writes_json_to_stdout(tmp_path):
    proc = ddpdoctor("env", "-n", "2", "--json", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # stdout holds the JSON alone
    envs = report["environment"]
    assert [e["rank"] for e in envs] == [0, 1]
    assert {e["backend"] for e in envs} == {"gloo"}
    assert envs[1]["variables"]["LOCAL_RANK"] == "1" and envs[0]["variables"]["WORLD_SIZE"] == "2"
    assert {c["id"]: c["status"] for c in report["checks"]} == {"rank-failure": "pass", "env-consistency": "pass"}


def test_env_on_two_simulated_nodes_shows_a_table(tmp_path):
    proc = ddpdoctor("env", "--nnodes", "2", "-n", "1", "--plain", "--json", str(tmp_path / "env.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "env.json").read_text())
    assert sorted((e["node"], e["local_rank"]) for e in report["environment"]) == [(0, 0), (1, 0)]
    assert "env: 2 of 2 ranks on 2 nodes" in proc.stdout
    for column in ("python", "torch", "CUDA", "NCCL", "driver", "GPU", "MASTER_ADDR"):
        assert column in proc.stdout
    assert "[PASS] env-consistency" in proc.stdout


def test_min_busbw_turns_a_slow_fabric_into_an_error(run_check):
    run = run_check(None, "--select", "collective-bandwidth", "--min-busbw", "1000000",
                    script_args=("--epochs", "1", "--num-samples", "256"))
    assert run.returncode == 1, run.output[-3000:]
    (finding,) = run.findings("collective-bandwidth", "error")
    assert "below --min-busbw 1e+06" in finding["message"]
    assert set(finding["evidence"]["peaks"]) == {"all_reduce", "all_gather", "reduce_scatter"}
