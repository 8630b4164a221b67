"""Analyzers on synthetic evidence of 1024 ranks: results must be right, and a quadratic blow-up
would show as a slow test (no timing assertion)."""

from __future__ import annotations

from builders import (config_state, ddp_wrap, distributed_sampler, distributed_shard, fp, loader_pass, make_evidence,
                      optimizer, step, usage)

from ddpdoctor.checks import config_sync, gradient_sync, optimizer_params, sampler_disjoint

WORLD = 1024
PER_RANK = 16
NUM_PARAMS = 16


def sharded_evidence(world_size, dataset_len, *, epochs=2, overrides=None):
    events = {}
    for r in range(world_size):
        indices = (overrides or {}).get(r) or distributed_shard(dataset_len, world_size, r)
        events[r] = [loader_pass(indices, number=e, dataset_len=dataset_len, batch_size=4,
                                 sampler=distributed_sampler(world_size, r, dataset_len, epoch=e))
                     for e in range(epochs)]
    return make_evidence(world_size, events)


def test_sampler_disjoint_on_1024_disjoint_shards_is_clean():
    result = sampler_disjoint.analyze(sharded_evidence(WORLD, WORLD * PER_RANK))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "2 passes over 1 loader(s): shards disjoint"


def test_sampler_disjoint_on_1024_ranks_finds_one_duplicated_shard():
    dataset_len = WORLD * PER_RANK
    result = sampler_disjoint.analyze(sharded_evidence(
        WORLD, dataset_len, overrides={WORLD - 1: distributed_shard(dataset_len, WORLD, 0)}))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.ranks == tuple(range(WORLD))
    assert finding.evidence["num_shared"] == PER_RANK
    assert finding.evidence["num_passes_affected"] == 2


def test_sampler_disjoint_on_1024_ranks_with_padding_is_info():
    dataset_len = WORLD * PER_RANK - 7
    (finding,) = sampler_disjoint.analyze(sharded_evidence(WORLD, dataset_len, epochs=1)).findings
    assert finding.severity == "info"
    assert finding.evidence["num_padding_duplicates"] == 7


def grad_evidence(world_size, *, odd_rank=None, num_steps=3, odd_config=None):
    names = [f"layer{i}.weight" for i in range(NUM_PARAMS)]
    events = {}
    for r in range(world_size):
        evs = [ddp_wrap(names), optimizer(names), usage(num_steps), config_state(1, "A")]
        for n in range(1, num_steps + 1):
            grads = fp(*[0.01 * i * n for i in range(NUM_PARAMS)])
            if r == odd_rank and n == num_steps:
                grads[NUM_PARAMS - 1] = [1e6, 1e6]
            digest = "A"
            if r == odd_config and n == num_steps:
                evs.append(config_state(n, "B", lr=0.2))
                digest = "B"
            evs.append(step(n, grads, fp(*[1.0 + i + 0.1 * n for i in range(NUM_PARAMS)]), config=digest))
        events[r] = evs
    return make_evidence(world_size, events)


def test_gradient_sync_on_1024_identical_replicas_is_clean():
    result = gradient_sync.analyze(grad_evidence(WORLD))
    assert result.findings == []
    assert result.summary == "replicas identical after 3 compared steps"


def test_gradient_sync_on_1024_ranks_finds_the_odd_rank():
    (finding,) = gradient_sync.analyze(grad_evidence(WORLD, odd_rank=777)).findings
    assert finding.evidence["step"] == 3
    assert finding.evidence["parameter"] == f"layer{NUM_PARAMS - 1}.weight"
    assert finding.evidence["rank_groups"] == [[r for r in range(WORLD) if r != 777], [777]]
    assert finding.ranks == tuple(range(WORLD))
    assert finding.evidence["case"] == "modified-after-backward"


def test_gradient_sync_on_1024_unwrapped_ranks_that_all_differ():
    # Worst case for grouping: every rank its own group (no DDP, each rank trains alone).
    names = ["w", "b"]
    events = {r: [optimizer(names, in_ddp=[False, False]), step(1, fp(1.0 + r, 2.0))] for r in range(WORLD)}
    (finding,) = gradient_sync.analyze(make_evidence(WORLD, events)).findings
    assert finding.evidence["case"] == "not-wrapped"
    assert finding.evidence["parameter"] == "w"
    assert len(finding.evidence["rank_groups"]) == WORLD
    assert finding.ranks == tuple(range(WORLD))


def test_config_sync_and_optimizer_params_on_1024_healthy_ranks_are_clean():
    evidence = grad_evidence(WORLD)
    assert config_sync.analyze(evidence).findings == []
    assert optimizer_params.analyze(evidence).findings == []


def test_config_sync_on_1024_ranks_finds_the_odd_rank():
    (finding,) = config_sync.analyze(grad_evidence(WORLD, odd_config=512)).findings
    assert finding.evidence["step"] == 3
    assert finding.evidence["rank_groups"] == [[r for r in range(WORLD) if r != 512], [512]]
    assert "`lr`: ranks 0-511, 513-1023: 0.1; rank 512: 0.2" in finding.message
