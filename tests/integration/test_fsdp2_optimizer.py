"""An optimizer built before FSDP2's `fully_shard` steps the tensors `fully_shard` replaced, which
never get a gradient: the job runs, prints a loss and does not train. optimizer-params is an error
at the optimizer's line, naming the `fully_shard` line; its known-good twin (good_fsdp2.py, the
optimizer built after the last `fully_shard`) stays clean (test_sharded_models.py). Real torchrun,
gloo ranks on CPU, assertions through the JSON report."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FIXTURE = "bad_fsdp2_optimizer_before_shard.py"
MODEL = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]


def _line(text: str) -> int:
    source = (Path(__file__).parents[2] / "fixtures" / FIXTURE).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if text in line]
    return number


def test_an_optimizer_built_before_fully_shard_is_an_error_at_its_line(run_check):
    run = run_check(FIXTURE)
    assert run.report is not None, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.found() == {("optimizer-params", "error")}, run.findings()
    (finding,) = run.findings("optimizer-params")
    built = _line("optimizer = torch.optim.AdamW")
    assert finding["location"]["file"].endswith(FIXTURE)
    assert finding["location"]["line"] == built
    assert finding["ranks"] == [0, 1]
    evidence = finding["evidence"]
    assert evidence["case"] == "replaced-by-sharding"
    assert evidence["api"] == "fully_shard"
    assert evidence["replaced"] == MODEL
    assert evidence["optimizer_tensors"] == len(MODEL)
    assert evidence["optimizer_built_at"]["line"] == built
    assert [site["line"] for site in evidence["sharded_at"]] == [_line("fully_shard(layer)")]
    assert f"(AdamW, built at {FIXTURE}:{built}) was built before `fully_shard`" in finding["message"]
    assert "the model never trains" in finding["message"]
    assert "after the last `fully_shard`, from `model.parameters()`" in finding["fix"]
    checks = {c["id"]: c for c in run.report["checks"]}
    assert checks["optimizer-params"]["status"] == "fail"
    assert checks["not-distributed"]["summary"] == "distributed training with FSDP2 on a 1-D mesh of 2"
