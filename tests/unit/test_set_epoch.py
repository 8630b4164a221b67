"""set-epoch: a shuffling DistributedSampler iterated again with the same epoch."""

from __future__ import annotations

from builders import SCRIPT, distributed_sampler, distributed_shard, loader_pass, make_evidence, plain_sampler

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.set_epoch import analyze


def epochs_pass(world_size, epochs, *, shuffle=True, dataset_len=8, order=None, loader=f"{SCRIPT}:12"):
    return {r: [loader_pass(distributed_shard(dataset_len, world_size, r), number=n, dataset_len=dataset_len,
                            sampler=distributed_sampler(world_size, r, dataset_len, shuffle=shuffle, epoch=epoch),
                            order=order, loader=loader)
                for n, epoch in enumerate(epochs)]
            for r in range(world_size)}


def test_same_epoch_on_every_pass_is_a_warning():
    result = analyze(make_evidence(2, epochs_pass(2, [0, 0, 0])))
    assert len(result.findings) == 1
    finding = result.findings[0]
    assert finding.check == "set-epoch"
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 12)
    assert finding.message.startswith("DistributedSampler with shuffle=True was iterated 3 times with sampler epoch "
                                      "0 repeated: set_epoch() is not called each epoch")
    assert finding.evidence["sampler_epochs"] == [0, 0, 0]
    assert finding.evidence["identical_order"] is True  # same shard -> same order hash
    assert "sampler.set_epoch(epoch)" in finding.fix
    assert result.status == "warn"
    assert result.summary == "set_epoch missing (ranks 0, 1)"


def test_one_repeated_epoch_among_new_ones_is_reported():
    result = analyze(make_evidence(2, epochs_pass(2, [0, 1, 1, 2])))
    (finding,) = result.findings
    assert "epoch 1 repeated" in finding.message
    assert finding.evidence["sampler_epochs"] == [0, 1, 1, 2]


def test_only_the_rank_that_repeats_the_epoch_is_named():
    events = epochs_pass(2, [0, 1])
    events[1] = epochs_pass(2, [0, 0])[1]
    (finding,) = analyze(make_evidence(2, events)).findings
    assert finding.ranks == (1,)


def test_new_epoch_every_pass_is_clean():
    result = analyze(make_evidence(2, epochs_pass(2, [0, 1, 2])))
    assert result.findings == []
    assert result.status == "pass"


def test_a_peek_or_evaluation_pass_without_optimizer_steps_is_not_a_repeated_epoch():
    # `next(iter(loader))` before the epoch loop: one batch, no optimizer step, same epoch 0.
    events = {}
    for r in range(2):
        shard = distributed_shard(8, 2, r)
        events[r] = [
            loader_pass(shard[:1], number=0, dataset_len=8, num_batches=1, steps=0, complete=False,
                        sampler=distributed_sampler(2, r, 8, epoch=0)),
            loader_pass(shard, number=1, dataset_len=8, sampler=distributed_sampler(2, r, 8, epoch=0)),
            loader_pass(shard, number=2, dataset_len=8, sampler=distributed_sampler(2, r, 8, epoch=1)),
        ]
    assert analyze(make_evidence(2, events)).findings == []


def test_not_shuffling_sampler_is_skipped():
    assert analyze(make_evidence(2, epochs_pass(2, [0, 0], shuffle=False))).status == "skip"


def test_non_distributed_sampler_is_skipped():
    events = [loader_pass(list(range(8)), number=n, dataset_len=8, sampler=plain_sampler()) for n in range(2)]
    assert analyze(make_evidence(2, events)).status == "skip"


def test_a_single_pass_is_skipped():
    result = analyze(make_evidence(2, epochs_pass(2, [0])))
    assert result.status == "skip"
    assert result.findings == []


def test_no_loader_pass_is_skipped():
    assert analyze(make_evidence(2, [])).status == "skip"


def test_a_pass_written_in_parts_counts_once():
    events = {}
    for r in range(2):
        shard = distributed_shard(8, 2, r)
        events[r] = [
            loader_pass(shard[:2], number=0, dataset_len=8, final=False, sampler=distributed_sampler(2, r, 8, epoch=0)),
            loader_pass(shard[2:], number=0, part=1, num_batches=4, dataset_len=8,
                        sampler=distributed_sampler(2, r, 8, epoch=0)),
            loader_pass(shard, number=1, dataset_len=8, sampler=distributed_sampler(2, r, 8, epoch=1)),
        ]
    result = analyze(make_evidence(2, events))
    assert result.findings == []
    assert result.status == "pass"
