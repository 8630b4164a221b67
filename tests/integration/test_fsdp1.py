"""FSDP1 (``FullyShardedDataParallel``) in a GPU script run on CPU ranks through the device
simulation (issue #32): wrapped in FSDP1's CPU mode, its collectives traced, a full state dict
gathered with ``offload_to_cpu`` on every rank and saved by rank 0 is clean; an optimizer built before
FSDP1 flattened the parameters (``use_orig_params=False``) is optimizer-params' error at its line.
Real torchrun, 2 gloo ranks, assertions through the JSON report."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FSDP1 = "distributed training with FSDP1 on a 1-D mesh of 2"


def _line(fixture: str, text: str) -> int:
    source = (Path(__file__).parents[2] / "fixtures" / fixture).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if text in line]
    return number


def test_a_gpu_fsdp1_script_is_clean_under_simulation(run_check):
    run = run_check("good_fsdp1.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.found() == set(), run.findings()
    checks = {c["id"]: c for c in run.report["checks"]}
    assert checks["not-distributed"]["summary"] == FSDP1
    assert checks["rank0-checkpoint"]["summary"] == "1 save(s), 0 load(s)"
    assert checks["collective-hang"]["status"] == "pass"
    assert checks["collective-hang"]["summary"].endswith("of them FSDP's)")
    simulated = run.report["device_simulation"]["simulated"]
    assert {"FSDP device_id->cpu", "FSDP state dict offload_to_cpu->in place", "nccl->gloo"} <= set(simulated)
    parallelism = run.report["parallelism"]
    assert (parallelism["wrapper"], parallelism["api"], parallelism["shard_dim"]) == \
        ("FSDP1", "FullyShardedDataParallel", 0)
    assert parallelism["location"]["line"] == _line("good_fsdp1.py", "model = FullyShardedDataParallel(")


def test_an_optimizer_built_before_fsdp1_flattens_the_parameters(run_check):
    fixture = "bad_fsdp1_optimizer_before_wrap.py"
    run = run_check(fixture)
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.found() == {("optimizer-params", "error")}, run.findings()
    (finding,) = run.findings("optimizer-params", "error")
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] == _line(fixture, "optimizer = torch.optim.AdamW(")
    evidence = finding["evidence"]
    assert evidence["api"] == "FullyShardedDataParallel"
    assert evidence["replaced"] == ["body.1.weight", "body.1.bias", "head.0.weight", "head.0.bias"]
    assert evidence["sharded_at"][0]["line"] == _line(fixture, "model = FullyShardedDataParallel(")
    assert "use_orig_params=True" in finding["fix"]
