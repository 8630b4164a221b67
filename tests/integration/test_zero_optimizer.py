"""ZeroRedundancyOptimizer beside DDP (issue #32): the report states the optimizer-state sharding;
consolidating its state on every rank and saving on rank 0 is clean; consolidating on rank 0 only
(a collective on one rank) is the hang it is, at its line. Real torchrun, 2 gloo ranks on CPU,
assertions through the JSON report."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _line(fixture: str, text: str) -> int:
    source = (Path(__file__).parents[2] / "fixtures" / fixture).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if text in line]
    return number


def test_consolidating_on_every_rank_and_saving_on_rank0_is_clean(run_check):
    run = run_check("good_zero_checkpoint.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.found() == set(), run.findings()
    checks = {c["id"]: c for c in run.report["checks"]}
    for check in ("gradient-sync", "optimizer-params", "config-sync", "rank0-checkpoint", "collective-hang"):
        assert checks[check]["status"] == "pass", checks[check]
    parallelism = run.report["parallelism"]
    assert (parallelism["wrapper"], parallelism["optimizer_sharding"]) == ("DDP", "ZeroRedundancyOptimizer")
    assert parallelism["description"] == "DDP over 2 ranks, optimizer state sharded by ZeroRedundancyOptimizer"
    assert parallelism["replicate_groups"] == [[0, 1]]


def test_consolidating_on_rank0_only_hangs_at_its_line(run_check):
    fixture = "hang_zero_consolidate_rank0_only.py"
    run = run_check(fixture, "--hang-timeout", "5")
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["outcome"] == "hung"
    assert run.found() == {("collective-hang", "error")}, run.findings()
    (hang,) = run.findings("collective-hang", "error")
    line = _line(fixture, "optimizer.consolidate_state_dict(to=0)")
    assert hang["location"]["file"].endswith(fixture) and hang["location"]["line"] == line
    states = hang["evidence"]["ranks"]
    assert states["0"]["state"] == "waiting" and states["0"]["where"]["line"] == line
    assert states["0"]["waiting_in"].startswith("broadcast #")
    assert f"rank 0 called broadcast of int64[1] at {fixture}:{line}" in hang["message"]
