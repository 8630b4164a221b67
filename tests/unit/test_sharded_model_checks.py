"""A model sharded with FSDP2 / HSDP / FSDP1 (no DDP module): not-distributed sees distributed
training and says what it found; gradient-sync compares HSDP's replicate-group peers (the ranks
holding the same shard) and says pure FSDP has no replica to compare; the other checks that compare
DDP replicas skip and say why."""

from __future__ import annotations

import pytest
from builders import SCRIPT, ddp_wrap, fp, init_pg, make_evidence, optimizer, sharded, step

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.buffer_sync import analyze as buffer_sync
from ddpdoctor.checks.config_sync import analyze as config_sync
from ddpdoctor.checks.gradient_sync import analyze as gradient_sync
from ddpdoctor.checks.not_distributed import analyze as not_distributed
from ddpdoctor.checks.optimizer_params import analyze as optimizer_params
from ddpdoctor.checks.uneven_inputs import analyze as uneven_inputs
from ddpdoctor.checks.unused_parameters import analyze as unused_parameters

REPLICA_CHECKS = (buffer_sync, unused_parameters, config_sync, optimizer_params)


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


def test_uneven_inputs_counts_a_sharded_models_steps():
    """No DDP iterations to count: the optimizer steps (and the loader passes) say the same."""
    even = uneven_inputs(_trained(sharded()))
    assert (even.findings, even.status, even.summary) == ([], "pass", "every rank ran the same number of steps")
    events = {rank: [init_pg(2), sharded(), optimizer(["0.weight"], in_ddp=[False]),
                     *(step(n, fp(1.0), fp(1.0)) for n in range(1, 4 - rank))] for rank in (0, 1)}
    (finding,) = uneven_inputs(make_evidence(2, events)).findings
    assert (finding.severity, finding.ranks) == ("error", (0, 1))
    assert finding.evidence["batches"] == {"0": 3, "1": 2}
    assert "Join does not support" in finding.fix and "Join([model])" not in finding.fix


def test_shards_that_differ_are_no_gradient_divergence():
    evidence = _trained(sharded(replicate_group=(0,)))
    assert gradient_sync(evidence).findings == []
    assert not_distributed(evidence).findings == []


def test_replicate_keeps_whole_replicas_and_ddp_beside_a_sharding_keeps_the_replica_checks():
    assert facts.ddp.sharded_without_ddp(_trained(sharded("replicate"))) is None
    with_ddp = _trained(sharded(), ddp_wrap(["0.weight", "0.bias"]), ranks_differ=False)
    assert facts.ddp.sharded_without_ddp(with_ddp) is None
    assert "sharded" not in gradient_sync(with_ddp).summary
    assert not_distributed(with_ddp).summary == "process group initialized and model wrapped in DDP"


# -- gradient-sync: HSDP's replicate dimension --------------------------------------------------------

HSDP_GROUPS = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}  # a 2x2 mesh [[0, 1], [2, 3]]: column = shard


def _hsdp(values=None, *, recorded: bool = True, fsdp1: bool = False):
    """Four ranks of HSDP on a 2x2 (replicate x shard) mesh that stepped twice. ``values``: {rank: [(grad,
    param) of step 1, of step 2]}, by default the shard's value (1 for ranks 0 and 2, 2 for 1 and 3) at
    both; ``recorded``: the sharding events carry each rank's replicate group."""
    events = {}
    for rank in range(4):
        shard = float(rank % 2 + 1)
        steps = (values or {}).get(rank, [(shard, shard), (shard, shard)])
        wrap = sharded("FullyShardedDataParallel" if fsdp1 else "fully_shard", mesh_shape=(2, 2),
                       mesh_dims=("replicate", "shard"), hybrid=True,
                       replicate_group=HSDP_GROUPS[rank] if recorded else ())
        events[rank] = [init_pg(4), wrap, optimizer(["0.weight", "0.bias"], in_ddp=[False, False]),
                        *(step(n, fp(g, shard), fp(p, shard)) for n, (g, p) in enumerate(steps, 1))]
    return make_evidence(4, events)


def test_pure_fsdp_has_no_replica_to_compare():
    result = gradient_sync(_trained(sharded(replicate_group=(0,))))
    assert (result.findings, result.status) == ([], "skip")
    assert result.summary == ("the model is sharded with FSDP2 on a 1-D mesh of 2: each rank holds the only copy of "
                              "its shard, so there is no replica to compare")


def test_hsdp_peers_holding_the_same_shard_are_compared():
    evidence = _hsdp()
    assert facts.ddp.replicate_groups(evidence) == [[0, 2], [1, 3]]
    result = gradient_sync(evidence)
    assert (result.findings, result.status) == ([], "pass")
    assert result.summary == "shards identical across the replicate dimension (2 groups of 2) after 2 compared steps"


def test_hsdp_fsdp1_hybrid_shard_is_compared_the_same_way():
    assert gradient_sync(_hsdp(fsdp1=True)).summary.startswith("shards identical across the replicate dimension")


def test_hsdp_peers_apart_from_the_first_step_started_apart():
    """A rank-dependent seed before the model was built: ranks 0 and 2 hold different values of the same
    shard from the start, while HSDP's all-reduce keeps their gradients equal."""
    result = gradient_sync(_hsdp({2: [(1.0, 5.0), (1.0, 6.0)]}))
    (finding,) = result.findings
    assert (finding.severity, finding.ranks) == ("error", (0, 2))
    assert (finding.evidence["case"], finding.evidence["step"], finding.evidence["parameter"],
            finding.evidence["compared"], finding.evidence["last_identical_step"]) == \
        ("shard-replicas-differ", 1, "0.weight", "params", None)
    assert finding.evidence["rank_groups"] == [[0], [2]]
    assert finding.message.startswith("`0.weight` differs between ranks 0, 2, which hold the same shard of it, already "
                                      "after the first compared optimizer step (1)")
    assert "`fully_shard` broadcasts nothing" in finding.message
    assert finding.location == Location(SCRIPT, 19)  # the sharding call
    assert result.summary == "replicas of a shard diverge at step 1 (ranks 0, 2)"


def test_hsdp_peers_apart_after_a_later_step_name_it():
    result = gradient_sync(_hsdp({2: [(1.0, 1.0), (1.0, 7.0)]}))
    (finding,) = result.findings
    assert (finding.ranks, finding.evidence["step"], finding.evidence["last_identical_step"]) == ((0, 2), 2, 1)
    assert "after optimizer step 2 (identical after step 1)" in finding.message
    assert finding.location == Location(SCRIPT, 30)  # the optimizer


def test_hsdp_gradients_that_differ_between_peers():
    result = gradient_sync(_hsdp({3: [(9.0, 2.0), (2.0, 2.0)]}))
    (finding,) = result.findings
    assert (finding.ranks, finding.evidence["compared"], finding.evidence["step"]) == ((1, 3), "grads", 1)
    assert finding.message.startswith("the gradient of `0.weight` differs at optimizer step 1 between ranks 1, 3")


def test_hsdp_without_the_recorded_replicate_groups_is_not_compared():
    """Evidence recorded before ShardedWrap carried each rank's replicate group."""
    evidence = _hsdp(recorded=False)
    assert facts.ddp.replicate_groups(evidence) is None
    result = gradient_sync(evidence)
    assert (result.findings, result.status) == ([], "skip")
    assert result.summary == ("the model is sharded with HSDP (FSDP2) on a 2x2 mesh (replicate x shard): which ranks "
                              "hold the same shard was not recorded, so the replicas were not compared")


def test_a_shard_event_without_its_replicate_group_still_loads():
    from ddpdoctor.schema.events import event_from_json
    event = event_from_json({"kind": "sharded_wrap", "api": "fully_shard", "mesh_shape": [2, 2], "hybrid": True})
    assert event.replicate_group == []
