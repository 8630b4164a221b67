"""The report's ``parallelism``: what wrapper the job trained with, over which mesh, which dimension
replicates and which shards, and an optimizer that shards its state; and the header line that says
so for anything but plain DDP over every rank."""

from __future__ import annotations

from builders import SCRIPT, ddp_wrap, init_pg, make_evidence, optimizer, sharded

from ddpdoctor.analysis.parallelism import parallelism
from ddpdoctor.analysis.render.words import parallelism_line


def _on_every_rank(world_size: int, *per_rank) -> dict:
    return {rank: [init_pg(world_size), *(e(rank) if callable(e) else e for e in per_rank)]
            for rank in range(world_size)}


def test_nothing_wrapped_is_no_parallelism():
    assert parallelism(make_evidence(2, _on_every_rank(2))) is None


def test_plain_ddp_over_every_rank():
    found = parallelism(make_evidence(2, _on_every_rank(2, ddp_wrap(group_ranks=[0, 1]))))
    assert found == {"wrapper": "DDP", "api": "DistributedDataParallel", "description": "DDP over 2 ranks",
                     "mesh_shape": [2], "mesh_dims": [""], "replicate_dim": 0, "shard_dim": None,
                     "replicate_groups": [[0, 1]], "optimizer_sharding": None,
                     "location": {"file": SCRIPT, "line": 20}}
    assert parallelism_line(found) is None  # what most jobs are: no header line


def test_ddp_over_a_sub_mesh_names_its_groups():
    groups = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    found = parallelism(make_evidence(4, _on_every_rank(4, lambda rank: ddp_wrap(group_ranks=groups[rank]))))
    assert found["description"] == "DDP over groups of 2 of the 4 ranks: (0, 2), (1, 3)"
    assert found["mesh_shape"] == [2] and found["replicate_groups"] == [[0, 2], [1, 3]]
    assert parallelism_line(found) == ("parallelism: DDP over groups of 2 of the 4 ranks: (0, 2), (1, 3); "
                                       "DistributedDataParallel at train.py:20")


def test_zero_beside_ddp_is_said():
    found = parallelism(make_evidence(2, _on_every_rank(
        2, ddp_wrap(), optimizer(type_name="ZeroRedundancyOptimizer"))))
    assert found["wrapper"] == "DDP" and found["optimizer_sharding"] == "ZeroRedundancyOptimizer"
    assert found["description"] == "DDP over 2 ranks, optimizer state sharded by ZeroRedundancyOptimizer"
    assert parallelism_line(found).startswith("parallelism: DDP over 2 ranks, optimizer state sharded by Zero")


def test_fsdp2_shards_along_its_only_dimension():
    found = parallelism(make_evidence(2, _on_every_rank(2, sharded(replicate_group=[0]))))
    assert (found["wrapper"], found["api"], found["description"]) == ("FSDP2", "fully_shard",
                                                                     "FSDP2 on a 1-D mesh of 2")
    assert (found["mesh_shape"], found["replicate_dim"], found["shard_dim"]) == ([2], None, 0)
    assert parallelism_line(found) == "parallelism: FSDP2 on a 1-D mesh of 2; fully_shard at train.py:19"


def test_hsdp_replicates_along_the_first_dimension_and_shards_along_the_second():
    groups = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    found = parallelism(make_evidence(4, _on_every_rank(4, lambda rank: sharded(
        mesh_shape=(2, 2), mesh_dims=("replicate", "shard"), hybrid=True, replicate_group=groups[rank]))))
    assert found["wrapper"] == "HSDP (FSDP2)"
    assert found["description"] == "HSDP (FSDP2) on a 2x2 mesh (replicate x shard)"
    assert (found["mesh_dims"], found["replicate_dim"], found["shard_dim"]) == (["replicate", "shard"], 0, 1)
    assert found["replicate_groups"] == [[0, 2], [1, 3]]


def test_fsdp1_without_a_mesh_and_replicate():
    fsdp1 = parallelism(make_evidence(2, _on_every_rank(2, sharded("FullyShardedDataParallel", mesh_shape=()))))
    assert (fsdp1["wrapper"], fsdp1["mesh_shape"], fsdp1["shard_dim"]) == ("FSDP1", [], None)
    replicated = parallelism(make_evidence(2, _on_every_rank(2, sharded("replicate"))))
    assert (replicated["wrapper"], replicated["replicate_dim"], replicated["shard_dim"]) == ("replicate()", 0, None)


def test_a_sharded_model_beside_ddp_reports_the_sharding():
    found = parallelism(make_evidence(2, _on_every_rank(2, ddp_wrap(), sharded())))
    assert found["wrapper"] == "FSDP2"
