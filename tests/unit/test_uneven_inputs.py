"""uneven-inputs: ranks running different numbers of training batches or steps."""

from __future__ import annotations

from builders import (SCRIPT, ddp_wrap, exception, failure, join, loader_pass, make_evidence, merge, on_all, step,
                      stop_snapshot, usage)

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.uneven_inputs import analyze


def uneven(batches_by_rank, *, complete_by_rank=None, extra=None, steps=None, **supervisor):
    world_size = len(batches_by_rank)
    passes = {r: [loader_pass(list(range(b)), num_batches=b, steps=b if steps is None else steps,
                              complete=(complete_by_rank or {}).get(r, True))]
              for r, b in batches_by_rank.items()}
    return make_evidence(world_size, merge(on_all(world_size, ddp_wrap()), passes, extra or {}), **supervisor)


def test_different_batch_counts_in_a_training_pass_are_an_error():
    result = analyze(uneven({0: 5, 1: 4}, complete_by_rank={0: False}, outcome="hung"))
    (finding,) = result.findings
    assert finding.check == "uneven-inputs"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 12)
    assert finding.message == ("ranks ran different numbers of training batches in training pass 1 over the DataLoader "
                               "(rank 0: 5, rank 1: 4) then hung: the ranks' shares of the data have different "
                               "lengths")
    assert finding.evidence["cause"] == "data"
    assert finding.evidence["batches"] == {"0": 5, "1": 4}
    assert finding.evidence["outcome"] == "hung"
    assert finding.evidence["num_uneven_passes"] == 1
    assert "Join" in finding.fix
    assert result.status == "fail"


def test_uneven_job_that_finished_anyway_says_so():
    (finding,) = analyze(uneven({0: 5, 1: 4, 2: 5})).findings
    assert "(rank 0: 5, rank 1: 4, rank 2: 5) and the job finished anyway" in finding.message
    assert finding.ranks == (0, 1, 2)


def test_uneven_step_totals_without_loader_passes_are_an_error():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {0: [step(1), step(2), step(3)], 1: [step(1), step(2)]}))
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.message == ("ranks ran different numbers of training batches in the whole run "
                               "(rank 0: 3, rank 1: 2) and the job finished anyway")
    assert finding.location is None


def test_join_used_for_uneven_inputs_gives_info_not_error():
    result = analyze(uneven({0: 5, 1: 4}, extra=on_all(2, join("enter"), join("exit"))))
    (finding,) = result.findings
    assert finding.severity == "info"
    assert finding.ranks == (0, 1)
    assert "inside Join" in finding.message
    assert result.status == "pass"
    assert result.summary == "uneven inputs handled by Join"


def test_join_on_only_some_ranks_does_not_excuse_uneven_inputs():
    (finding,) = analyze(uneven({0: 5, 1: 4}, extra={0: [join("enter")]})).findings
    assert finding.severity == "error"


def test_equal_batch_counts_are_clean():
    result = analyze(uneven({0: 5, 1: 5}))
    assert result.findings == []
    assert result.status == "pass"


def test_uneven_evaluation_passes_are_not_training():
    result = analyze(uneven({0: 5, 1: 4}, steps=0))
    assert result.findings == []


def test_a_crashed_rank_stopping_early_is_left_to_rank_failure():
    result = analyze(uneven({0: 5, 1: 2}, complete_by_rank={1: False}, outcome="failed",
                            extra={1: [exception(t=5.0)]}))
    assert result.findings == []


def test_a_rank_killed_by_a_signal_stopping_early_is_left_to_rank_failure():
    result = analyze(uneven({0: 5, 1: 2}, complete_by_rank={1: False}, outcome="failed",
                            failures=[failure(1, exitcode=-9, signal="SIGKILL")]))
    assert result.findings == []


def test_a_rank_that_exited_non_zero_stopping_early_is_left_to_rank_failure():
    result = analyze(uneven({0: 5, 1: 2}, complete_by_rank={1: False}, outcome="failed",
                            failures=[failure(1, exitcode=1, signal=None)]))
    assert result.findings == []


def test_single_process_is_skipped():
    assert analyze(uneven({0: 5})).status == "skip"


def test_no_ddp_is_skipped():
    evidence = make_evidence(2, {0: [loader_pass([0, 1])], 1: [loader_pass([2])]})
    result = analyze(evidence)
    assert result.status == "skip"
    assert result.summary == "no DDP training on several ranks"


def test_the_last_part_of_a_pass_gives_its_batch_count():
    # Rank 0's pass was written at 3 batches (a stall made the monitor ask), then went on to finish
    # with 5 like rank 1's.
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [loader_pass(list(range(3)), final=False), loader_pass([3, 4], part=1, num_batches=5)],
        1: [loader_pass(list(range(5, 10)))],
    }))
    result = analyze(evidence)
    assert result.findings == []


def test_an_open_pass_of_a_rank_stopped_by_ddpdoctor_counts_its_batches():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [loader_pass(list(range(5)), final=False)],
        1: [loader_pass(list(range(5, 9)))],
    }), outcome="hung")
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.evidence["batches"] == {"0": 5, "1": 4}


def _usage(backwards: int):
    event = usage(backwards)
    event.backwards = backwards
    return event


def test_loader_bookkeeping_that_differs_is_no_finding_when_ddp_ran_the_same_iterations():
    """A rank that made and dropped an extra iterator (`next(iter(loader))` to log a batch, a framework
    looking ahead) numbers its passes differently; DDP's own count says the ranks trained alike."""
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [loader_pass([0], number=0, num_batches=1, steps=0, ddp_forwards=0),
            loader_pass(list(range(5)), number=1), _usage(5)],
        1: [loader_pass(list(range(5, 10)), number=0), loader_pass([], number=1, num_batches=0, steps=0), _usage(5)],
    }))
    result = analyze(evidence)
    assert result.findings == []
    assert result.summary == "every rank ran the same number of DDP training iterations (10 in all)"


def test_training_passes_pair_by_their_order_not_their_number():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [loader_pass([0], number=0, num_batches=1, steps=0, ddp_forwards=0),
            loader_pass(list(range(5)), number=1, complete=False), _usage(5)],
        1: [loader_pass(list(range(5, 9)), number=0), _usage(4)],
    }), outcome="hung")
    (finding,) = analyze(evidence).findings
    assert finding.evidence["batches"] == {"0": 5, "1": 4}
    assert finding.evidence["ddp_iterations"] == {"0": 5, "1": 4}
    assert finding.evidence["cause"] == "data"


def test_ddp_iterations_that_differ_without_a_loader_are_an_error():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {0: [_usage(6)], 1: [_usage(5)]}), outcome="hung")
    (finding,) = analyze(evidence).findings
    assert finding.message == ("ranks ran different numbers of DDP training iterations in the whole run "
                               "(rank 0: 6, rank 1: 5) then hung")


def test_an_interrupted_job_draws_nothing_from_its_cut_counts():
    stop = stop_snapshot({0: {}, 1: {}}, {}, reason="interrupted", signal="SIGINT")
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {0: [_usage(6)], 1: [_usage(5)]}), stop=stop)
    assert analyze(evidence).status == "skip"


def test_counts_a_stall_cut_short_with_no_loader_to_explain_them_are_no_finding():
    """One rank stuck in its own code, the other in DDP's all-reduce one iteration ahead: the
    counts differ only because ddpdoctor stopped them; collective-hang reports the stall."""
    stop = stop_snapshot({0: {}, 1: {}}, {}, reason="no-progress")
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {0: [_usage(4)], 1: [_usage(3)]}), stop=stop,
                             outcome="hung")
    result = analyze(evidence)
    assert result.findings == [] and "cut short" in result.summary
