"""Content audit: overlap statistics on synthetic fingerprints, and the findings built from them."""

from __future__ import annotations

import random

from builders import SCRIPT, content_pass, ddp_wrap, make_evidence

from ddpdoctor.analysis import content
from ddpdoctor.analysis.causality import link
from ddpdoctor.checks.sampler_disjoint import analyze as sampler_disjoint
from ddpdoctor.checks.set_epoch import analyze as set_epoch
from ddpdoctor.schema.findings import Finding



def corpus(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(n)]


def streams(per_rank: dict[int, list[int]], **fields) -> dict[int, content.Stream]:
    return {r: content.Stream(content_pass(h, **fields), tuple(h)) for r, h in per_rank.items()}


def test_every_rank_reading_everything_is_significant():
    data = corpus(512)
    result = content.overlap(streams({0: data, 1: data}))
    assert result.fraction == 1.0 and result.num_shared == 512
    assert result.expected < 0.01
    assert result.significant and result.ranks == (0, 1)


def test_disjoint_shards_are_clean():
    data = corpus(512)
    result = content.overlap(streams({0: data[::2], 1: data[1::2]}))
    assert result.fraction == 0.0 and not result.significant


def test_random_draws_with_replacement_from_a_corpus_stay_clean():
    """Per-rank random windows of a small corpus: collisions across ranks are as frequent as
    within a rank, so chance explains them."""
    data = corpus(2000)
    for seed in range(20):
        rng = random.Random(seed)
        draws = {r: [rng.choice(data) for _ in range(640)] for r in range(2)}
        result = content.overlap(streams(draws))
        assert result.num_shared > 0  # 640 draws from 2000: the ranks do meet by chance
        assert not result.significant, (seed, result.fraction, result.expected)


def test_genuine_duplicates_under_a_correct_sampler_stay_clean():
    unique = corpus(512)
    data = unique + unique[::4]  # a quarter of the samples twice
    for seed in range(20):
        order = list(range(len(data)))
        random.Random(seed).shuffle(order)
        shards = {r: [data[i] for i in order[r::2]] for r in range(2)}
        result = content.overlap(streams(shards))
        assert result.num_shared > 0
        assert not result.significant, (seed, result.fraction, result.expected)


def test_ranks_with_their_own_file_order_overlap_by_half():
    data = corpus(512)
    orders = {r: random.Random(r).sample(data, len(data)) for r in range(2)}
    result = content.overlap(streams({r: o[r::2] for r, o in orders.items()}))
    assert 0.35 < result.fraction < 0.65
    assert result.significant


def test_too_few_rows_are_not_judged():
    data = corpus(16)
    result = content.overlap(streams({0: data, 1: data}))
    assert not result.judged and not result.significant


def test_ranks_are_compared_at_the_coarsest_sampling_level():
    data = corpus(4000)
    kept_at_1 = [h for h in data if h >> 62 == 0]
    per_rank = {0: content.Stream(content_pass(data), tuple(data)),
                1: content.Stream(content_pass(kept_at_1, level=1), tuple(kept_at_1))}
    result = content.overlap(per_rank)
    assert result.level == 1
    assert result.fraction == 1.0 and result.rows[0] == len(kept_at_1)


def test_wrap_around_padding_is_recognised():
    data = corpus(100)
    rank0 = data[0:16] + data[32:48] + data[64:80] + data[96:100] + data[0:12]
    rank1 = data[16:32] + data[48:64] + data[80:96] + data[0:16]
    per_rank = streams({0: rank0, 1: rank1}, batch_rows=16)
    result = content.overlap(per_rank)
    assert result.num_shared == 16
    assert content.looks_like_padding(per_rank, result)


def test_repeated_orders_need_identical_complete_passes():
    data = corpus(64)
    same = [content.Stream(content_pass(data, number=n), tuple(data)) for n in range(3)]
    assert content.repeated_orders(same) == [(1, 0), (2, 1)]
    shuffled = [content.Stream(content_pass(random.Random(n).sample(data, 64), number=n), ()) for n in range(3)]
    assert content.repeated_orders(shuffled) == []


# -- findings -------------------------------------------------------------------------------------

def test_iterable_read_whole_is_one_error_with_source_and_fix():
    data = corpus(256)
    evidence = make_evidence(2, [ddp_wrap(), content_pass(data, dataset_type="DigitStream", num_workers=2)])
    result = sampler_disjoint(evidence)
    (finding,) = result.findings
    assert finding.severity == "error" and finding.ranks == (0, 1)
    assert finding.evidence["basis"] == "content" and finding.evidence["source"] == "loader"
    assert finding.evidence["dataset_type"] == "DigitStream" and finding.evidence["overlap_fraction"] == 1.0
    assert "by rank and by worker" in finding.fix
    assert "sharding by worker alone is not enough" in finding.message
    assert finding.location.file == SCRIPT and finding.location.line == 12


def test_forward_input_without_a_loader_is_reported_as_forward_input():
    data = corpus(256)
    evidence = make_evidence(2, [ddp_wrap(), content_pass(data, source="forward", key="ddp0")])
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.evidence["source"] == "forward" and finding.evidence["module"] == "ddp0"
    assert "DistributedSampler" in finding.fix


def test_loader_overlap_that_the_forward_inputs_do_not_share_is_clean():
    """Every rank reads the whole stream and keeps its own slice of each batch."""
    data = corpus(512)
    label = content.feed_label(f"{SCRIPT}:12", 0)
    evidence = make_evidence(2, {r: [ddp_wrap(), content_pass(data),
                                     content_pass(data[r::2], source="forward", key="ddp0", feeds=label)]
                                 for r in range(2)})
    result = sampler_disjoint(evidence)
    assert result.findings == []
    assert result.applicable


def test_evaluation_passes_do_not_raise_errors():
    data = corpus(256)
    evidence = make_evidence(2, [ddp_wrap(), content_pass(data, steps=0)])
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "info" and "evaluation is repeated" in finding.message


def test_content_evidence_read_back_from_a_report_keeps_its_type():
    """A saved report's evidence comes back as the record it was (each shape its own type)."""
    data = corpus(256)
    evaluation = make_evidence(2, [ddp_wrap(), content_pass(data, steps=0)])
    forward = make_evidence(2, [ddp_wrap(), content_pass(data, source="forward", key="ddp0")])
    training = make_evidence(2, [ddp_wrap(), content_pass(data, dataset_type="DigitStream", num_workers=2)])
    for evidence in (evaluation, forward, training):
        (finding,) = sampler_disjoint(evidence).findings
        back = Finding.from_json(finding.to_json())
        assert type(back.evidence) is type(finding.evidence)
        assert list(back.evidence.to_json().items()) == list(finding.evidence.to_json().items())


def test_evaluation_padding_at_the_tail_is_a_warning():
    data = corpus(100)
    rank0 = data[0:16] + data[32:48] + data[64:80] + data[96:100] + data[0:12]
    rank1 = data[16:32] + data[48:64] + data[80:96] + data[0:16]
    evidence = make_evidence(2, {0: [ddp_wrap(), content_pass(rank0, steps=0, batch_rows=16)],
                                 1: [ddp_wrap(), content_pass(rank1, steps=0, batch_rows=16)]})
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "warning" and "padding duplicates" in finding.message


def test_training_padding_is_not_overlap():
    data = corpus(100)
    rank0 = data[0:16] + data[32:48] + data[64:80] + data[96:100] + data[0:12]
    rank1 = data[16:32] + data[48:64] + data[80:96] + data[0:16]
    evidence = make_evidence(2, {0: [ddp_wrap(), content_pass(rank0, batch_rows=16, iterable=False)],
                                 1: [ddp_wrap(), content_pass(rank1, batch_rows=16, iterable=False)]})
    assert sampler_disjoint(evidence).findings == []


def test_content_overlap_under_an_index_overlap_is_its_consequence():
    from builders import loader_pass

    data = corpus(128)
    evidence = make_evidence(2, [ddp_wrap(), loader_pass(list(range(128)), dataset_len=128),
                                 content_pass(data, iterable=False)])
    findings = sampler_disjoint(evidence).findings
    assert [f.evidence.get("basis", "indices") for f in findings] == ["indices", "content"]
    (root,) = link(findings)
    assert root.evidence.get("basis", "indices") == "indices"
    assert [c.evidence.get("basis") for c in root.consequences] == ["content"]


def _stream_passes(data, *, set_epoch_method=None, dataset_epoch=None, declares_shuffle=None, number_of_passes=3):
    per_rank = {}
    for r in range(2):
        passes = []
        for n in range(number_of_passes):
            event = content_pass(data[r::2] * 2, number=n, dataset_type="Shards")
            event.set_epoch_method, event.declares_shuffle = set_epoch_method, declares_shuffle
            event.dataset_epoch = dataset_epoch(n) if callable(dataset_epoch) else dataset_epoch
            passes.append(event)
        per_rank[r] = [ddp_wrap()] + passes
    return make_evidence(2, per_rank)


def test_iterable_stream_in_its_natural_order_every_epoch_is_info():
    (finding,) = set_epoch(_stream_passes(corpus(64))).findings
    assert finding.severity == "info" and finding.ranks == (0, 1)
    assert finding.evidence["repeated_passes"]["0"] == [[1, 0], [2, 1]]
    assert "fine if its fixed order is intended" in finding.message


def test_a_stream_whose_set_epoch_is_never_called_is_a_warning():
    (finding,) = set_epoch(_stream_passes(corpus(64), set_epoch_method=True, dataset_epoch=0)).findings
    assert finding.severity == "warning"
    assert "set_epoch is never called" in finding.message


def test_a_stream_that_sets_its_epoch_but_keeps_its_order_is_info():
    (finding,) = set_epoch(_stream_passes(corpus(64), set_epoch_method=True, dataset_epoch=lambda n: n)).findings
    assert finding.severity == "info"


def test_a_stream_that_says_it_shuffles_with_the_same_permutation_is_a_warning():
    (finding,) = set_epoch(_stream_passes(corpus(64), declares_shuffle=True)).findings
    assert finding.severity == "warning" and "same permutation every epoch" in finding.message


def test_a_reshuffled_stream_is_clean():
    data = corpus(64)
    reshuffled = make_evidence(2, {r: [ddp_wrap()] + [content_pass(random.Random(n).sample(data, 64), number=n)
                                                      for n in range(3)] for r in range(2)})
    assert set_epoch(reshuffled).findings == []


def _forward_window(key: str, digests: list[str], *, feeds=None, steps: int = 8, line: int = 40):
    event = content_pass(corpus(8 * len(digests), seed=len(key)), source="forward", key=key, feeds=feeds,
                         steps=steps, batch_rows=8)
    event.first_forward, event.digests, event.site = 1, digests, [{"file": SCRIPT, "line": line, "function": "main"}]
    return event


def test_identical_batches_at_the_same_step_from_the_loader_are_an_error_naming_it():
    label = content.feed_label(f"{SCRIPT}:12", 0)
    same = [f"{i:016x}" for i in range(8)]  # unprefixed: each forward's input was the loader's batch
    evidence = make_evidence(2, [ddp_wrap(), _forward_window("ddp0", same, feeds=label)])
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and finding.evidence["kind"] == "same-step"
    assert finding.evidence["made_in_script"] is False and finding.evidence["loader"] == f"{SCRIPT}:12"
    assert "identical batches" in finding.message and "came from the DataLoader at train.py:12" in finding.message


def test_inputs_the_script_makes_alike_beside_a_loader_name_the_script_and_one_finding_for_all_modules():
    """A GAN whose noise is seeded alike: the generator's and the critic's inputs are identical, one cause."""
    label = content.feed_label(f"{SCRIPT}:12", 0)
    noise = [f"s:{i:016x}" for i in range(8)]
    fakes = [f"s:{i + 100:016x}" for i in range(8)]
    evidence = make_evidence(2, [ddp_wrap(), _forward_window("ddp0", noise, feeds=label, line=44),
                                 _forward_window("ddp1", fakes, feeds=label, line=48)])
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and finding.location.line == 44
    assert finding.evidence["made_in_script"] is True and finding.evidence["loader"] is None
    assert finding.evidence["also_modules"] == ["ddp1"]
    assert "the script made them" in finding.message and "DDP module ddp1 (line 48)" in finding.message
    assert "torch.Generator" in finding.fix and "seed + rank" in finding.fix


def test_identical_inputs_without_steps_are_info_and_different_inputs_are_clean():
    same = [f"s:{i:016x}" for i in range(8)]
    untrained = make_evidence(2, [ddp_wrap(), _forward_window("ddp0", same, steps=0)])
    (finding,) = sampler_disjoint(untrained).findings
    assert finding.severity == "info" and finding.evidence["trained"] is False
    differ = make_evidence(2, {r: [ddp_wrap(), _forward_window("ddp0", [f"s:{r}{i:015x}" for i in range(8)])]
                               for r in range(2)})
    assert [f for f in sampler_disjoint(differ).findings if f.evidence.get("kind") == "same-step"] == []


# -- independent random draws per rank (llama2.c's PretokDataset) ------------------------------------

def _ordered(per_rank: dict[int, list[int]], **fields) -> dict[int, content.Stream]:
    """Streams whose feeding order was recorded, as the probe writes it."""
    return {r: content.Stream(content_pass(h, **fields), tuple(h), tuple(h)) for r, h in per_rank.items()}


def _rank_permutations(pool: list[int], rows: int, ranks: int = 2) -> dict[int, list[int]]:
    """Each rank reads the first ``rows`` of its own seeded shuffle of one pool."""
    return {r: random.Random(42 + 1337 * r).sample(pool, len(pool))[:rows] for r in range(ranks)}


def test_rows_shared_in_the_same_order_are_aligned_and_in_unrelated_orders_are_not():
    pool = corpus(256)
    same = content.shared_order(_ordered({0: pool[:100], 1: pool[:100]}), 0)
    assert same.aligned and same.correlation == 1.0 and same.num_rows == 100
    shifted = content.shared_order(_ordered({0: pool[:100], 1: pool[40:140]}), 0)
    assert shifted.aligned and shifted.num_rows == 60
    for seed in range(20):  # independent shuffles: never mistaken for one stream
        draws = {r: random.Random(seed * 10 + r).sample(pool, 100) for r in range(2)}
        order = content.shared_order(_ordered(draws), 0)
        assert order is not None and not order.aligned, (seed, order)


def test_the_order_is_unknown_without_enough_shared_rows_recorded():
    pool = corpus(256)
    assert content.shared_order(_ordered({0: pool[:100], 1: pool[95:195]}), 0) is None  # 5 shared rows
    unrecorded = {r: content.Stream(content_pass(pool[:100]), tuple(pool[:100])) for r in range(2)}
    assert content.shared_order(unrecorded, 0) is None


def test_ranks_drawing_their_own_random_sample_of_one_stream_are_info_with_the_pool_size():
    """llama2.c: seed = 42 + worker_id + 1337 * rank; each rank reads 100 of 256 windows, cut short."""
    pool = corpus(256)
    draws = _rank_permutations(pool, 100)
    evidence = make_evidence(2, {r: [ddp_wrap(), content_pass(d, dataset_type="PretokDataset", batch_rows=4,
                                                              complete=False)] for r, d in draws.items()})
    result = sampler_disjoint(evidence)
    (finding,) = result.findings
    assert finding.severity == "info" and finding.evidence["kind"] == "random-draws"
    assert finding.evidence["overlap_fraction"] > 0.25  # far above the 'chance' of draws spread over a corpus
    assert not finding.evidence["shared_order_correlation"] > content.ALIGNED_CORRELATION
    assert 150 < finding.evidence["pool_estimate"] < 400
    assert "in unrelated orders: each rank draws its own random sample from one pool of about" in finding.message
    assert "random sampling, not a partition of the data" in finding.message
    assert result.status == "pass" and "no sharding bug" in result.summary


def test_ranks_reading_one_stream_in_the_same_order_stay_an_error():
    pool = corpus(256)
    stream = random.Random(42).sample(pool, 256)[:100]  # the seed left the rank out
    evidence = make_evidence(2, [ddp_wrap(), content_pass(stream, dataset_type="PretokDataset", complete=False)])
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and finding.evidence["shared_order_correlation"] == 1.0
    assert finding.message.endswith("every rank reads what its __iter__ yields, and the ranks read one stream in "
                                    "the same order")


def test_every_rank_reading_its_whole_stream_in_its_own_order_is_an_error():
    """A finite stream shuffled per rank and read to its end: every rank saw all the data that epoch."""
    pool = corpus(256)
    evidence = make_evidence(2, {r: [ddp_wrap(), content_pass(d, dataset_type="Shards")]
                                 for r, d in _rank_permutations(pool, 256).items()})
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and finding.evidence["overlap_fraction"] == 1.0
    assert "every rank read the whole stream to its end, each in its own order" in finding.message


def test_random_draws_whose_order_was_not_recorded_stay_an_error():
    pool = corpus(256)
    evidence = make_evidence(2, {r: [ddp_wrap(), content_pass(d, complete=False, sequence=[])]
                                 for r, d in _rank_permutations(pool, 100).items()})
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and "shared_order_correlation" not in finding.evidence


def test_the_sequence_of_a_pass_written_in_parts_is_joined_in_part_order():
    first, second = content_pass([1, 2, 3]), content_pass([9, 8])
    second.part, first.sequence, second.sequence = 1, [3, 1, 2], [9, 8]
    (streams,) = content.merge_streams([(0, second), (0, first)]).values()
    assert streams[0].sequence == (3, 1, 2, 9, 8)


# -- identical batches from a dataset of identical samples (open_clip --dataset-type synthetic) -------

def _same_step_over_disjoint_positions(rows: dict[int, list[int]]):
    """Each rank's DistributedSampler shard (disjoint positions of one dataset, each drawn once) fed
    8 forwards whose batches (digests) were identical across the ranks; ``rows`` are the row hashes
    each rank's loader pass yielded."""
    from builders import loader_pass

    label = content.feed_label(f"{SCRIPT}:12", 0)
    per_rank = {}
    for r in range(2):
        window = _forward_window("ddp0", [f"{i:016x}" for i in range(8)], feeds=label)
        per_rank[r] = [ddp_wrap(), loader_pass(list(range(r, 32, 2)), dataset_len=32, dataset_digest="aa"),
                       content_pass(rows[r], iterable=False, batch_rows=2), window]
    return make_evidence(2, per_rank)


def test_identical_batches_from_disjoint_positions_of_identical_samples_are_info():
    blank = corpus(1)[0]
    evidence = _same_step_over_disjoint_positions({r: [blank] * 16 for r in range(2)})
    result = sampler_disjoint(evidence)
    (finding,) = result.findings
    assert finding.severity == "info" and finding.evidence["kind"] == "identical-samples"
    assert finding.message == ("ranks 0, 1 fed identical batches to DDP at 8 of 8 training forwards, but the "
                               "DataLoader at train.py:12 gave them disjoint samples of one dataset: the dataset holds "
                               "identical samples (a synthetic or constant dataset?), not a sharding bug")
    assert result.status == "pass"


def test_identical_batches_from_disjoint_positions_of_samples_that_differ_are_an_error():
    """The dataset ignores its index (noise from a generator seeded alike): nothing repeats on a rank."""
    noise = corpus(16)
    evidence = _same_step_over_disjoint_positions({r: noise for r in range(2)})
    (finding,) = sampler_disjoint(evidence).findings
    assert finding.severity == "error" and finding.evidence["indices"] == "disjoint"
    assert finding.message.endswith("although its sampler gave the ranks disjoint positions of one dataset: the "
                                    "dataset's items do not follow the index they are asked for")
    assert "`__getitem__(index)`" in finding.fix
