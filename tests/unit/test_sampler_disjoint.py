"""sampler-disjoint: overlapping shards, unseen samples, DistributedSampler padding, eval loaders."""

from __future__ import annotations

import random

from builders import (SCRIPT, content_pass, ddp_wrap, distributed_sampler, distributed_shard, loader_pass,
                      make_evidence, plain_sampler)

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.sampler_disjoint import analyze
from ddpdoctor.schema.events import SamplerInfo


def ds_passes(dataset_len, world_size, *, steps=None, number=0, num_replicas=None, **kwargs):
    """Each rank's pass over an unshuffled DistributedSampler shard."""
    return {r: [loader_pass(distributed_shard(dataset_len, world_size, r, num_replicas=num_replicas),
                            sampler=distributed_sampler(world_size, r, dataset_len, num_replicas=num_replicas),
                            dataset_len=dataset_len, steps=steps, number=number, **kwargs)]
            for r in range(world_size)}


def corpus(n: int, seed: int = 0) -> list[int]:
    """n distinct row hashes."""
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(n)]


def only_finding(result):
    assert len(result.findings) == 1, result.findings
    return result.findings[0]


# -- overlap --------------------------------------------------------------------------------------

def test_every_rank_drawing_every_sample_of_a_training_loader_is_an_error():
    evidence = make_evidence(2, [loader_pass(list(range(10)), dataset_len=10, sampler=plain_sampler("RandomSampler"))])
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.check == "sampler-disjoint"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 12)
    assert finding.message == ("10 of 10 samples of the training DataLoader were drawn by more than one rank in "
                               "pass 0 (sampler RandomSampler)")
    assert finding.evidence["num_shared"] == 10
    assert finding.evidence["shared_examples"] == list(range(10))
    assert finding.evidence["num_passes_affected"] == 1
    assert "DistributedSampler(dataset)" in finding.fix
    assert result.status == "fail"
    assert result.summary == "overlapping or missing samples in 1 loader(s) (ranks 0, 1)"


def test_rank_seeded_distributed_sampler_partial_overlap_is_an_error_with_the_seed_fix():
    evidence = make_evidence(2, {
        0: [loader_pass([0, 1, 2, 3, 4], dataset_len=10, sampler=distributed_sampler(2, 0, 10, seed=0))],
        1: [loader_pass([3, 4, 5, 6, 7], dataset_len=10, sampler=distributed_sampler(2, 1, 10, seed=1))],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "error"
    assert finding.evidence["num_shared"] == 2
    assert finding.evidence["shared_examples"] == [3, 4]
    assert "2 of 10 samples" in finding.message
    assert "seed" in finding.fix


def test_overlap_is_reported_once_per_loader_with_the_first_pass_and_the_count_of_passes():
    events = {r: [loader_pass(list(range(8)), dataset_len=8, number=n) for n in range(3)] for r in range(2)}
    finding = only_finding(analyze(make_evidence(2, events)))
    assert finding.evidence["pass"] == 0
    assert finding.evidence["num_passes_affected"] == 3


def test_overlap_between_two_of_four_ranks_names_all_compared_ranks():
    evidence = make_evidence(4, {
        0: [loader_pass([0, 1], dataset_len=8)],
        1: [loader_pass([2, 3], dataset_len=8)],
        2: [loader_pass([4, 5], dataset_len=8)],
        3: [loader_pass([4, 7], dataset_len=8)],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "error"
    assert finding.ranks == (0, 1, 2, 3)
    assert finding.evidence["shared_examples"] == [4]


# -- unseen samples --------------------------------------------------------------------------------

def test_num_replicas_larger_than_world_size_leaves_samples_unseen():
    evidence = make_evidence(2, ds_passes(100, 2, num_replicas=4))
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.severity == "error"  # half the data: more than a quarter unseen
    assert finding.ranks == (0, 1)
    assert finding.message == "50 of 100 samples of the training DataLoader were drawn by no rank in pass 0"
    assert finding.evidence["num_unseen"] == 50
    assert finding.evidence["expected_unseen"] == 0
    assert finding.evidence["sampler_num_replicas"] == 4
    assert finding.evidence["world_size"] == 2
    assert "num_replicas" in finding.fix
    assert result.status == "fail"


def test_few_unseen_samples_are_a_warning():
    evidence = make_evidence(2, {
        0: [loader_pass(list(range(0, 45)), dataset_len=100, sampler=plain_sampler("SequentialSampler"))],
        1: [loader_pass(list(range(45, 90)), dataset_len=100, sampler=plain_sampler("SequentialSampler"))],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "warning"
    assert finding.evidence["num_unseen"] == 10


def test_batches_a_resumed_epoch_skips_are_not_unseen_samples():
    """Accelerate's skip_first_batches (the Hugging Face Trainer resuming mid-epoch) never draws the
    batches trained before the checkpoint."""
    passes = {r: [loader_pass(list(range(r * 50 + 20, r * 50 + 50)), dataset_len=100, batch_size=10,
                              sampler=plain_sampler("SequentialSampler"))] for r in range(2)}
    for events in passes.values():
        events[0].skipped_batches = 2
    assert analyze(make_evidence(2, passes)).findings == []


def test_unseen_samples_are_not_judged_on_an_incomplete_pass():
    evidence = make_evidence(2, {
        0: [loader_pass(list(range(0, 10)), dataset_len=100, complete=False)],
        1: [loader_pass(list(range(50, 60)), dataset_len=100, complete=False)],
    })
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"


def test_samples_dropped_by_the_loaders_drop_last_are_allowed():
    # 2 ranks, batch_size 4, drop_last: up to 2 * 3 samples may go unseen.
    evidence = make_evidence(2, {
        0: [loader_pass(list(range(0, 8)), dataset_len=22, batch_size=4, drop_last=True)],
        1: [loader_pass(list(range(11, 19)), dataset_len=22, batch_size=4, drop_last=True)],
    })
    assert analyze(evidence).findings == []


# -- padding ---------------------------------------------------------------------------------------

def test_distributed_sampler_padding_on_a_training_loader_is_info_only():
    events = ds_passes(5, 2)
    assert distributed_shard(5, 2, 0) == [0, 2, 4] and distributed_shard(5, 2, 1) == [1, 3, 0]  # padded with 0
    result = analyze(make_evidence(2, events))
    finding = only_finding(result)
    assert finding.severity == "info"
    assert finding.ranks == (0, 1)
    assert finding.evidence["num_padding_duplicates"] == 1
    assert finding.evidence["padding_examples"] == [0]
    assert "padded the training DataLoader with 1 repeated samples" in finding.message
    assert result.status == "pass"
    assert result.summary == "1 passes over 1 loader(s): shards disjoint"


def test_distributed_sampler_padding_on_an_evaluation_loader_is_a_warning():
    result = analyze(make_evidence(2, ds_passes(5, 2, steps=0)))
    finding = only_finding(result)
    assert finding.severity == "warning"
    assert "padded the evaluation DataLoader with 1 repeated samples" in finding.message
    assert "count them twice" in finding.message
    assert result.status == "warn"


def test_a_pass_cut_short_after_its_first_batch_is_not_padding():
    """Ranks that crashed in their first forward: the one batch each drew is both first and last,
    and the few samples two shuffling ranks happened to share are no wrap-around."""
    evidence = make_evidence(2, {0: [loader_pass([5, 9, 40, 77], dataset_len=256, batch_size=4, steps=0,
                                                 complete=False)],
                                 1: [loader_pass([9, 12, 100, 200], dataset_len=256, batch_size=4, steps=0,
                                                 complete=False)]})
    finding = only_finding(analyze(evidence))
    assert "padded" not in finding.message
    assert finding.evidence["num_shared"] == 1


def test_more_duplicates_than_the_padding_are_an_overlap():
    sampler = distributed_sampler(2, 0, 5)
    evidence = make_evidence(2, {
        0: [loader_pass([0, 1, 2], dataset_len=5, sampler=sampler)],
        1: [loader_pass([1, 2, 3], dataset_len=5, sampler=distributed_sampler(2, 1, 5))],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "error"
    assert finding.evidence["num_shared"] == 2


# -- evaluation loaders -----------------------------------------------------------------------------

def test_eval_loader_where_every_rank_iterates_the_full_set_is_info():
    evidence = make_evidence(2, [loader_pass(list(range(10)), dataset_len=10, steps=0,
                                             sampler=plain_sampler("SequentialSampler"))])
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.severity == "info"
    assert finding.message.startswith("every rank iterated all 10 samples of the evaluation DataLoader (pass 0)")
    assert result.status == "pass"


def test_eval_loader_with_partial_overlap_is_a_warning():
    evidence = make_evidence(2, {
        0: [loader_pass([0, 1, 2, 3], dataset_len=6, steps=0)],
        1: [loader_pass([2, 3, 4, 5], dataset_len=6, steps=0)],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "warning"
    assert "evaluation DataLoader" in finding.message


def test_training_and_evaluation_loaders_are_judged_separately():
    events = {r: [loader_pass(distributed_shard(8, 2, r), dataset_len=8, sampler=distributed_sampler(2, r, 8),
                              loader=f"{SCRIPT}:12"),
                  loader_pass(list(range(4)), dataset_len=4, steps=0, loader=f"{SCRIPT}:13", line=13)]
              for r in range(2)}
    result = analyze(make_evidence(2, events))
    finding = only_finding(result)
    assert finding.severity == "info"
    assert finding.evidence["loader"] == f"{SCRIPT}:13"
    assert finding.location == Location(SCRIPT, 13)


# -- clean ----------------------------------------------------------------------------------------

def test_disjoint_distributed_sampler_shards_are_clean():
    result = analyze(make_evidence(4, ds_passes(16, 4)))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "1 passes over 1 loader(s): shards disjoint"


# -- datasets each rank builds for itself ------------------------------------------------------------

def _rank_local_passes(rows: dict[int, list[int]], *, digests: dict[int, str], lengths: dict[int, int]) -> dict:
    """Each rank drew positions 0..n-1 of its own dataset (behind a plain shuffling loader), whose
    rows (content hashes) are ``rows[rank]``."""
    return {r: [ddp_wrap(), loader_pass(list(range(lengths[r])), dataset_len=lengths[r], dataset_digest=digests[r]),
                content_pass(rows[r], iterable=False, dataset_type="ImageFiles")] for r in rows}


def test_positions_into_datasets_each_rank_built_are_not_an_overlap():
    """improved-diffusion's loader: rank r holds files[r::2]; both ranks draw 0..63, different files."""
    files = corpus(128)
    evidence = make_evidence(2, _rank_local_passes({0: files[0::2], 1: files[1::2]}, digests={0: "aa", 1: "bb"},
                                                   lengths={0: 64, 1: 64}))
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == ("1 passes compared by content: no overlap (1 of them over datasets each rank built "
                              "itself)")


def test_datasets_of_different_lengths_are_told_apart_without_a_digest():
    """Evidence without identity digests: shards of an odd file list have different lengths."""
    files = corpus(129)
    evidence = make_evidence(2, _rank_local_passes({0: files[0::2], 1: files[1::2]}, digests={0: None, 1: None},
                                                   lengths={0: 65, 1: 64}))
    assert analyze(evidence).findings == []


def test_rank_local_datasets_whose_samples_overlap_are_an_error_by_content():
    """Each rank built its own dataset, but from overlapping slices: the content shows it."""
    files = corpus(384)
    evidence = make_evidence(2, _rank_local_passes({0: files[:256], 1: files[128:]}, digests={0: "aa", 1: "bb"},
                                                   lengths={0: 256, 1: 256}))
    finding = only_finding(analyze(evidence))
    assert (finding.severity, finding.evidence["basis"], finding.evidence["indices"]) == ("error", "content",
                                                                                          "rank-local")
    assert "each rank built its own dataset" in finding.message
    assert "[rank::world_size]" in finding.fix


def test_the_same_dataset_on_every_rank_behind_a_shuffling_loader_is_still_an_index_overlap():
    files = corpus(64)
    evidence = make_evidence(2, _rank_local_passes({0: files, 1: files}, digests={0: "aa", 1: "aa"},
                                                   lengths={0: 64, 1: 64}))
    findings = analyze(evidence).findings
    assert [(f.severity, f.evidence.get("basis", "indices")) for f in findings] == [("error", "indices"),
                                                                                   ("error", "content")]
    assert findings[1].evidence["indices"] == "overlapping"
    assert "the sampler drew the same positions on several ranks" in findings[1].message


# -- not applicable --------------------------------------------------------------------------------

def test_single_process_is_skipped():
    result = analyze(make_evidence(1, [loader_pass(list(range(10)), dataset_len=10)]))
    assert result.status == "skip"


def test_no_loader_pass_is_skipped():
    assert analyze(make_evidence(2, [])).status == "skip"


def test_pass_seen_on_one_rank_only_is_skipped():
    result = analyze(make_evidence(2, {0: [loader_pass(list(range(10)), dataset_len=10)], 1: []}))
    assert result.status == "skip"
    assert result.summary == "no DataLoader pass seen on two ranks"


def test_passes_without_batches_are_skipped():
    assert analyze(make_evidence(2, [loader_pass([], dataset_len=10)])).status == "skip"


def test_passes_with_opaque_indices_are_not_compared():
    event = loader_pass(list(range(10)), dataset_len=10)
    event.indices = None
    result = analyze(make_evidence(2, [event]))
    assert result.findings == []


def test_a_pass_written_in_parts_is_judged_whole():
    # Only the final, complete part of rank 0's pass can show that sample 3 was never drawn.
    evidence = make_evidence(2, {
        0: [loader_pass([0, 1], dataset_len=8, final=False),
            loader_pass([2], dataset_len=8, part=1, num_batches=3)],
        1: [loader_pass([4, 5, 6, 7], dataset_len=8)],
    })
    finding = only_finding(analyze(evidence))
    assert finding.severity == "warning"
    assert finding.evidence["num_unseen"] == 1


# -- a whole batch padded by wrap-around (Accelerate's even_batches) ---------------------------------

def test_a_whole_batch_of_wrap_around_padding_under_a_sharding_batch_sampler_is_info_naming_the_sampler():
    """Five shuffled batches of 96 on two ranks: rank 1's third batch is a copy of the first one."""
    order = random.Random(0).sample(range(480), 480)
    batches = [order[i:i + 96] for i in range(0, 480, 96)]
    sampler = plain_sampler("RandomSampler")
    sampler.batch_sampler = "BatchSamplerShard"
    draws = {0: batches[0] + batches[2] + batches[4], 1: batches[1] + batches[3] + batches[0]}
    evidence = make_evidence(2, {r: [loader_pass(d, dataset_len=480, batch_size=None, num_batches=3, keep=192,
                                                 sampler=sampler)] for r, d in draws.items()})
    finding = only_finding(analyze(evidence))
    assert finding.severity == "info" and finding.evidence["num_padding_duplicates"] == 96
    assert finding.message == ("the sampler (RandomSampler under BatchSamplerShard) padded the training DataLoader "
                               "with 96 repeated samples so every rank gets the same count (480 samples on 2 ranks)")


# -- repetition by design (DeiT's RASampler) --------------------------------------------------------

def _repeated(num_samples: int, world_size: int, *, repeats: int = 3, keep: int = 0) -> dict[int, list[int]]:
    """RASampler's draws: each shuffled index ``repeats`` times, a rank's slice, its first ``keep``."""
    order = random.Random(0).sample(range(num_samples), num_samples)
    listed = [i for i in order for _ in range(repeats)]
    return {r: listed[r::world_size][:keep or None] for r in range(world_size)}


def _rank_aware(type_: str, world_size: int, rank: int) -> SamplerInfo:
    sampler = plain_sampler(type_)
    sampler.num_replicas, sampler.rank = world_size, rank
    return sampler


def test_a_sampler_that_knows_the_ranks_and_repeats_every_sample_on_purpose_is_info():
    draws = _repeated(512, 2, keep=256)
    evidence = make_evidence(2, {r: [loader_pass(d, dataset_len=512, population=None,
                                                 sampler=_rank_aware("RASampler", 2, r))] for r, d in draws.items()})
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.severity == "info" and finding.evidence["repeats"] == 3
    assert finding.message == ("RASampler draws every sample 3 times across the 2 ranks on purpose (repeated "
                               "augmentation): it knows the ranks (num_replicas=2 and each rank's own rank), so 171 "
                               "of 512 samples of the training DataLoader were drawn by more than one rank in pass 0")
    assert result.status == "pass" and "no sharding bug" in result.summary


def test_repetition_on_four_ranks_is_info_too():
    draws = _repeated(256, 4)
    evidence = make_evidence(4, {r: [loader_pass(d, dataset_len=256, population=None,
                                                 sampler=_rank_aware("RepeatAugSampler", 4, r))]
                                 for r, d in draws.items()})
    assert only_finding(analyze(evidence)).evidence["repeats"] == 3


def test_a_rank_aware_sampler_whose_slices_overlap_at_random_is_an_error_with_the_seed_fix():
    """ShardSampler(rank, num_replicas) shuffling with a seed that depends on the rank."""
    draws = {r: random.Random(1000 * r).sample(range(512), 512)[r::2] for r in range(2)}
    evidence = make_evidence(2, {r: [loader_pass(d, dataset_len=512, population=None,
                                                 sampler=_rank_aware("ShardSampler", 2, r))] for r, d in draws.items()})
    finding = only_finding(analyze(evidence))
    assert finding.severity == "error" and "(sampler ShardSampler)" in finding.message
    assert finding.fix.startswith("ShardSampler knows the ranks, yet their draws overlap: shuffle with a seed that "
                                  "is the same on every rank")


def test_repetition_is_not_deliberate_when_the_sampler_does_not_know_the_ranks():
    draws = _repeated(512, 2, keep=256)
    wrong_rank = {r: [loader_pass(d, dataset_len=512, population=None, sampler=_rank_aware("RASampler", 2, 0))]
                  for r, d in draws.items()}
    assert only_finding(analyze(make_evidence(2, wrong_rank))).severity == "error"
    same_draws = {r: [loader_pass(draws[0], dataset_len=512, population=None, sampler=_rank_aware("RASampler", 2, r))]
                  for r in range(2)}
    assert only_finding(analyze(make_evidence(2, same_draws))).severity == "error"


def test_a_distributed_sampler_whose_draws_repeat_alike_is_never_deliberate():
    """DistributedSampler(num_replicas=1) on two ranks: every sample twice, the same on each rank."""
    evidence = make_evidence(2, ds_passes(64, 2, num_replicas=1))
    assert only_finding(analyze(evidence)).severity == "error"


# -- the population a sampler covers ---------------------------------------------------------------

def test_samples_outside_a_wrapped_fold_sampler_are_not_unseen():
    """Fabric's kfold: DistributedSamplerWrapper(SubsetRandomSampler(train_ids)), 128 of 256 samples."""
    fold = random.Random(0).sample(range(128), 128)
    evidence = make_evidence(2, {r: [loader_pass(fold[r::2], dataset_len=256, population=128,
                                                 sampler=distributed_sampler(2, r, 128))] for r in range(2)})
    result = analyze(evidence)
    assert result.findings == [] and result.status == "pass"


def test_a_fold_sampler_drawn_by_half_leaves_its_other_half_unseen():
    fold = list(range(128))
    evidence = make_evidence(2, {r: [loader_pass(fold[r::4], dataset_len=256, population=128,
                                                 sampler=distributed_sampler(2, r, 128, num_replicas=4))]
                                 for r in range(2)})
    finding = only_finding(analyze(evidence))
    assert finding.message == "64 of 128 samples of the training DataLoader were drawn by no rank in pass 0"


def test_nothing_is_unseen_where_the_sampler_does_not_say_what_it_covers():
    evidence = make_evidence(2, {r: [loader_pass(list(range(r * 10, r * 10 + 10)), dataset_len=100, population=None,
                                                 sampler=plain_sampler("CustomSampler"))] for r in range(2)})
    assert analyze(evidence).findings == []
