"""A model sharded with FSDP2 / HSDP / FSDP1 (no DDP module): not-distributed sees distributed
training and says what it found; the checks that compare DDP replicas skip and say why."""

from __future__ import annotations

import pytest
from builders import ddp_wrap, fp, init_pg, make_evidence, optimizer, sharded, step

from ddpdoctor.analysis import facts
from ddpdoctor.checks.buffer_sync import analyze as buffer_sync
from ddpdoctor.checks.config_sync import analyze as config_sync
from ddpdoctor.checks.gradient_sync import analyze as gradient_sync
from ddpdoctor.checks.not_distributed import analyze as not_distributed
from ddpdoctor.checks.optimizer_params import analyze as optimizer_params
from ddpdoctor.checks.uneven_inputs import analyze as uneven_inputs
from ddpdoctor.checks.unused_parameters import analyze as unused_parameters

REPLICA_CHECKS = (gradient_sync, buffer_sync, unused_parameters, uneven_inputs, config_sync, optimizer_params)


def _trained(*wraps, ranks_differ: bool = True):
    """Two ranks that initialized a process group, made ``wraps`` and stepped twice; their
    fingerprints differ (each rank holds its own shard) unless ``ranks_differ`` is False."""
    events = {}
    for rank in (0, 1):
        value = float(rank + 1) if ranks_differ else 1.0
        events[rank] = [init_pg(2), *wraps, optimizer(["0.weight", "0.bias"], in_ddp=[False, False]),
                        step(1, fp(value, value), fp(value, value)), step(2, fp(value, value), fp(value, value))]
    return make_evidence(2, events)


@pytest.mark.parametrize("wrap, said", [
    (sharded(), "FSDP2 on a 1-D mesh of 2"),
    (sharded(mesh_shape=(2, 2), mesh_dims=("replicate", "shard"), hybrid=True),
     "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)"),
    (sharded(mesh_shape=(2, 2), hybrid=True), "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)"),
    (sharded("FullyShardedDataParallel", mesh_shape=(2,)), "FSDP1 on a 1-D mesh of 2"),
    (sharded("FullyShardedDataParallel", mesh_shape=()), "FSDP1"),
    (sharded(mesh_shape=(2,), mesh_dims=("dp",)), "FSDP2 on a 1-D mesh of 2 (dp)"),
])
def test_a_sharded_model_is_distributed_training_said_in_the_summary(wrap, said):
    result = not_distributed(_trained(wrap))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == f"distributed training with {said}"


def test_without_the_sharding_event_the_same_job_is_still_told_to_use_ddp():
    result = not_distributed(_trained())
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert "DistributedDataParallel" in finding.fix


def test_sharding_without_a_recorded_process_group_is_no_missing_process_group_error():
    # init_device_mesh can initialize the default process group itself.
    events = [sharded(), optimizer(["w"], in_ddp=[False]), step(1, fp(1.0), fp(1.0))]
    result = not_distributed(make_evidence(2, events))
    assert result.findings == []
    assert result.summary == "distributed training with FSDP2 on a 1-D mesh of 2"


@pytest.mark.parametrize("analyze", REPLICA_CHECKS, ids=lambda a: a.__module__.rsplit(".", 1)[-1])
def test_checks_comparing_ddp_replicas_skip_a_sharded_model_and_say_why(analyze):
    result = analyze(_trained(sharded()))
    assert result.findings == []
    assert result.status == "skip"
    assert result.summary == ("the model is sharded with FSDP2 on a 1-D mesh of 2: this check compares DDP replicas "
                              "and does not check sharded models yet")


def test_shards_that_differ_are_no_gradient_divergence():
    evidence = _trained(sharded())
    assert gradient_sync(evidence).findings == []
    assert not_distributed(evidence).findings == []


def test_replicate_keeps_whole_replicas_and_ddp_beside_a_sharding_keeps_the_replica_checks():
    assert facts.ddp.sharded_without_ddp(_trained(sharded("replicate"))) is None
    with_ddp = _trained(sharded(), ddp_wrap(["0.weight", "0.bias"]), ranks_differ=False)
    assert facts.ddp.sharded_without_ddp(with_ddp) is None
    assert "sharded" not in gradient_sync(with_ddp).summary
    assert not_distributed(with_ddp).summary == "process group initialized and model wrapped in DDP"
