"""Models trained without the DistributedDataParallel class: FSDP2 (1-D mesh), HSDP (FSDP2 on a
2-D mesh, 4 ranks), and ZeroRedundancyOptimizer beside DDP. Known-good scripts stay clean (no
warning, no error, no probe error, exit 0); not-distributed says what it found, and the checks
that compare DDP replicas skip a sharded model and say why, never "incomplete". Real torchrun,
gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

REPLICA_CHECKS = ("gradient-sync", "buffer-sync", "unused-parameters", "uneven-inputs", "config-sync",
                  "optimizer-params")


def _checks(run) -> dict[str, dict]:
    return {c["id"]: c for c in run.report["checks"]}


def _clean(run) -> None:
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(), run.findings()
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []


@pytest.mark.parametrize("fixture, options, said", [
    ("good_fsdp2.py", (), "FSDP2 on a 1-D mesh of 2"),
    ("good_hsdp.py", ("-n", "4"), "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)"),
])
def test_a_sharded_model_is_clean_and_said_as_found(run_check, fixture, options, said):
    run = run_check(fixture, *options)
    _clean(run)
    checks = _checks(run)
    assert checks["not-distributed"]["status"] == "pass"
    assert checks["not-distributed"]["summary"] == f"distributed training with {said}"
    for check in REPLICA_CHECKS:
        assert checks[check]["status"] == "skip", checks[check]
        assert checks[check]["summary"] == (f"the model is sharded with {said}: this check compares DDP replicas "
                                            "and does not check sharded models yet")
        assert "incomplete" not in checks[check]
    for check in ("sampler-disjoint", "set-epoch", "collective-hang", "rank-failure"):
        assert checks[check]["status"] == "pass", checks[check]


def test_zero_optimizer_beside_ddp_is_still_checked_as_ddp(run_check):
    run = run_check("good_zero_optimizer.py")
    _clean(run)
    checks = _checks(run)
    assert checks["not-distributed"]["summary"] == "process group initialized and model wrapped in DDP"
    assert checks["gradient-sync"]["status"] == "pass", checks["gradient-sync"]
    assert checks["optimizer-params"]["status"] == "pass", checks["optimizer-params"]
