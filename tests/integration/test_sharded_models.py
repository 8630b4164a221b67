"""Models trained without the DistributedDataParallel class: FSDP2 (1-D mesh), HSDP (FSDP2 on a
2-D mesh, 4 ranks), and ZeroRedundancyOptimizer beside DDP. Known-good scripts stay clean (no
warning, no error, no probe error, exit 0); not-distributed says what it found; gradient-sync
compares HSDP's replicate-group peers (the ranks that hold the same shard) and says that pure FSDP
has no replica to compare; the other checks that compare DDP replicas skip a sharded model and say
why, never "incomplete". Real torchrun, gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

REPLICA_CHECKS = ("buffer-sync", "unused-parameters", "config-sync",
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
    _clean_and_said(run_check, fixture, options, said)


def _clean_and_said(run_check, fixture, options, said) -> dict[str, dict]:
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
    for check in ("sampler-disjoint", "set-epoch", "collective-hang", "rank-failure", "uneven-inputs"):
        assert checks[check]["status"] == "pass", checks[check]
    return checks


def test_pure_fsdp_has_no_replica_to_compare(run_check):
    checks = _clean_and_said(run_check, "good_fsdp2.py", (), "FSDP2 on a 1-D mesh of 2")
    assert checks["gradient-sync"]["status"] == "skip", checks["gradient-sync"]
    assert checks["gradient-sync"]["summary"] == ("the model is sharded with FSDP2 on a 1-D mesh of 2: each rank "
                                                  "holds the only copy of its shard, so there is no replica to compare")


def test_hsdp_shards_are_compared_across_the_replicate_dimension(run_check):
    checks = _clean_and_said(run_check, "good_hsdp.py", ("-n", "4"), "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)")
    assert checks["gradient-sync"]["status"] == "pass", checks["gradient-sync"]
    summary = checks["gradient-sync"]["summary"]
    assert summary.startswith("shards identical across the replicate dimension (2 groups of 2) after 8 compared steps")


def test_the_report_states_the_parallelism_it_found(run_check):
    """The wrapper, the mesh, which dimension replicates and which shards, the replicate groups."""
    run = run_check("good_hsdp.py", "-n", "4")
    _clean(run)
    found = run.report["parallelism"]
    assert (found["wrapper"], found["api"], found["mesh_shape"]) == ("HSDP (FSDP2)", "fully_shard", [2, 2])
    assert (found["replicate_dim"], found["shard_dim"]) == (0, 1)
    assert found["replicate_groups"] == [[0, 2], [1, 3]]
    assert found["location"]["file"].endswith("good_hsdp.py")


def test_hsdp_replicas_built_from_a_rank_seed_diverge(run_check):
    """The known-bad twin of good_hsdp.py: the model built after torch.manual_seed(SEED + rank). Ranks 0
    and 2 hold the same shard with different values (as do 1 and 3): gradient-sync says so, at the
    first compared step and the first parameter, pointing at the fully_shard call; nothing else fires."""
    run = run_check("bad_hsdp_replicas_diverge.py", "-n", "4")
    assert run.report is not None, run.output[-3000:]
    assert run.found() == {("gradient-sync", "error")}, run.findings()
    assert run.report["probe_errors"] == []
    assert run.report["outcome"] == "completed"
    [finding] = run.findings("gradient-sync")
    assert finding["ranks"] == [0, 2]
    evidence = finding["evidence"]
    assert (evidence["case"], evidence["step"], evidence["parameter"], evidence["compared"]) == \
        ("shard-replicas-differ", 1, "conv1.weight", "params")
    assert evidence["rank_groups"] == [[0], [2]] and evidence["last_identical_step"] is None
    assert finding["location"]["file"].endswith("bad_hsdp_replicas_diverge.py")
    assert "`fully_shard` broadcasts nothing" in finding["message"]
    assert finding["consequences"] == []
    checks = _checks(run)
    assert checks["gradient-sync"]["summary"].startswith("replicas of a shard diverge at step 1 (ranks 0, 2)")
    for check in REPLICA_CHECKS:
        assert checks[check]["status"] == "skip", checks[check]


def test_zero_optimizer_beside_ddp_is_still_checked_as_ddp(run_check):
    run = run_check("good_zero_optimizer.py")
    _clean(run)
    checks = _checks(run)
    assert checks["not-distributed"]["summary"] == "process group initialized and model wrapped in DDP"
    assert checks["gradient-sync"]["status"] == "pass", checks["gradient-sync"]
    assert checks["optimizer-params"]["status"] == "pass", checks["optimizer-params"]
