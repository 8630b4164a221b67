"""Derived facts shared by the checks: computed once, right on synthetic evidence."""

from __future__ import annotations

from builders import (collective, ddp_wrap, exception, failure, fp, loader_pass, make_evidence, merge, on_all,
                      optimizer, step, stop_snapshot, usage)

from ddpdoctor.analysis.facts import collectives, ddp, derived, failures, loaders, steps
from ddpdoctor.checks import collective_hang, rank_failure


def test_facts_are_computed_once_per_evidence():
    evidence = make_evidence(2, on_all(2, collective("all_reduce", 1)))
    assert collectives.world_traces(evidence) is collectives.world_traces(evidence)
    assert collectives.world_traces(make_evidence(2, {})) == {}  # each evidence has its own


def test_forget_drops_the_facts_derived_so_far():
    evidence = make_evidence(2, on_all(2, collective("all_reduce", 1)))
    before = collectives.world_traces(evidence)
    derived.forget(evidence)
    assert collectives.world_traces(evidence) is not before
    assert collectives.world_traces(evidence) == before


def test_world_traces_leave_out_subgroups_and_point_to_point():
    evidence = make_evidence(2, on_all(2, collective("all_reduce", 1), collective("all_reduce", 2, group=[0]),
                                       collective("send", 2, units=0), collective("barrier", 2, shape=None)))
    assert [e.op for e in collectives.world_traces(evidence)[0].entries] == ["all_reduce", "barrier"]


def test_first_mismatch_and_divergence():
    evidence = make_evidence(2, {0: [collective("all_reduce", 1), collective("barrier", 2, shape=None)],
                                 1: [collective("all_reduce", 1)]})
    assert collective_hang.collective_mismatch(evidence) is None
    divergence = collectives.divergence(evidence)
    assert divergence.n == 2 and divergence.absent == [1] and list(divergence.present) == [0]


def test_first_gradient_divergence_and_steps_compared():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap(), optimizer()), {
        0: [step(1, fp(1.0, 2.0)), step(2, fp(1.0, 2.0))],
        1: [step(1, fp(1.0, 2.0)), step(2, fp(1.0, 3.0))]}))
    divergence, compared = steps.divergence(evidence)
    assert (divergence.step, divergence.index, divergence.kind, compared) == (2, 1, "grads", 2)
    assert divergence.last_identical_step == 1


def test_loader_pass_parts_merge_into_one_pass():
    evidence = make_evidence(2, {0: [loader_pass([0, 1], final=False), loader_pass([2, 3], part=1, num_batches=4)],
                                 1: [loader_pass([4, 5, 6, 7])]})
    merged = loaders.passes(evidence)[("/job/train.py:12", 0)][0]
    assert merged.num_batches == 4 and merged.complete and merged.num_samples == 4
    assert merged.head[:2] == [0, 1]


def test_ddp_usage_keeps_the_totals_with_most_iterations():
    evidence = make_evidence(2, on_all(2, usage(3, {1: 1}, final=False), usage(7, {1: 2})))
    assert ddp.usage(evidence)[0][1].iterations == 7


def test_failures_are_ordered_and_secondary_ones_flagged():
    evidence = make_evidence(2, {
        0: [exception("RuntimeError", "Connection closed by peer", t=3.0)],
        1: [exception("ValueError", "bad batch", t=5.0)]}, outcome="failed")
    found = failures.rank_failures(evidence)
    assert [(f.rank, f.secondary) for f in found] == [(0, True), (1, False)]
    assert failures.first_failure(evidence).rank == 1
    assert rank_failure.failed_ranks(found) == {0, 1}


def test_torchrun_rows_count_unless_ddpdoctor_stopped_the_job():
    rows = [failure(1, exitcode=-9, signal="SIGKILL")]
    assert [f.kind for f in failures.rank_failures(make_evidence(2, {}, failures=rows))] == ["signal"]
    stopped = make_evidence(2, {}, failures=rows, stop=stop_snapshot({}, {}, reason="timeout"))
    assert failures.rank_failures(stopped) == []


def test_a_peers_error_raised_after_ddpdoctor_stopped_the_job_is_not_a_failure():
    stop = stop_snapshot({0: {}, 1: {}}, {})
    stop.t = 100.0
    evidence = make_evidence(2, {1: [exception("RuntimeError", "Connection closed by peer", t=101.0)],
                                 0: [exception("ValueError", "bad batch", t=102.0)]}, outcome="hung", stop=stop)
    assert [(f.rank, f.type) for f in failures.rank_failures(evidence)] == [(0, "ValueError")]
