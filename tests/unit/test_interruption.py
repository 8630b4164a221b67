"""An interrupted run: the counts the stop cut off are left out, what every rank completed is judged."""

from __future__ import annotations

import pytest
from builders import (SCRIPT, collective, ddp_wrap, distributed_sampler, distributed_shard, exception, init_pg,
                      loader_pass, make_evidence, optimizer, step, stop_snapshot)

from ddpdoctor.analysis.interruption import leave_out_cut_off, summary
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze


def _rank(rank: int, *, batches_in_pass_1: int, steps_in_pass_1: int, collectives: int, overlap: bool = False):
    """Pass 0 finished (4 batches, 4 steps), pass 1 still open when the signal came."""
    sampler = distributed_sampler(2, rank, 8)
    shard = list(range(4)) if overlap else distributed_shard(8, 2, rank)
    events = [init_pg(2), ddp_wrap(), optimizer(),
              loader_pass(shard, sampler=sampler, dataset_len=8, number=0),
              *[step(n) for n in range(1, 5)],
              loader_pass(shard[:batches_in_pass_1], sampler=distributed_sampler(2, rank, 8, epoch=1), dataset_len=8,
                          number=1, final=False),
              *[step(n) for n in range(5, 5 + steps_in_pass_1)],
              *[collective("all_reduce", n) for n in range(1, collectives + 1)]]
    return events


def _evidence(outcome: str, *, overlap: bool = False, extra: dict | None = None):
    events = {0: _rank(0, batches_in_pass_1=3, steps_in_pass_1=3, collectives=8, overlap=overlap),
              1: _rank(1, batches_in_pass_1=2, steps_in_pass_1=2, collectives=7, overlap=overlap)}
    for rank, more in (extra or {}).items():
        events[rank] += more
    stop = stop_snapshot({0: {"steps": 7}, 1: {"steps": 6}}, {}, reason="interrupted", signal="SIGINT") \
        if outcome == "interrupted" else None
    evidence = make_evidence(2, events, outcome=outcome, stop=stop)
    if stop is not None:
        stop.t = 1000.0
    return evidence


def _roots(analysis) -> dict[str, str]:
    return {f.check: f.severity for f in analysis.findings if f.severity != "info"}


def test_the_same_cut_off_counts_would_be_uneven_inputs_if_the_run_had_ended_there():
    """The counterfactual: without an interruption these counts are a real finding."""
    assert "uneven-inputs" in _roots(analyze(_evidence("completed")))


def test_an_interrupted_run_reports_nothing_from_the_counts_the_stop_cut_off():
    evidence = _evidence("interrupted")
    analysis = analyze(evidence)
    assert analysis.findings == []
    assert analysis.left_out is not None
    assert analysis.left_out.passes == [f"{SCRIPT}:12#1"]  # pass 1 of the loader, on both ranks
    assert analysis.left_out.steps == {0: 1}  # rank 0 stepped once more than rank 1
    assert analysis.left_out.collectives == {0: 1}
    statuses = {o.id: o.status for o in analysis.outcomes}
    assert statuses["uneven-inputs"] in ("pass", "skip") and statuses["rank-failure"] == "pass"


def test_a_problem_in_what_every_rank_finished_is_still_reported():
    analysis = analyze(_evidence("interrupted", overlap=True))
    assert _roots(analysis) == {"sampler-disjoint": "error"}


def test_keyboard_interrupts_and_peer_errors_of_the_stop_are_not_failures():
    extra = {0: [exception("KeyboardInterrupt", "", t=1000.2, step=7)],
             1: [exception("RuntimeError", "[gloo] Connection closed by peer [127.0.0.1]:555", t=1000.5, step=6)]}
    assert analyze(_evidence("interrupted", extra=extra)).findings == []


def test_passes_a_rank_had_not_reached_are_left_out_on_every_rank():
    sampler = distributed_sampler(2, 0, 8)
    events = {0: [loader_pass([0, 2, 4, 6], sampler=sampler, number=0),
                  loader_pass([0, 2, 4, 6], sampler=sampler, number=1)],
              1: [loader_pass([1, 3, 5, 7], sampler=sampler, number=0)]}
    evidence = make_evidence(2, events, outcome="interrupted")
    left = leave_out_cut_off(evidence)
    assert len(left.passes) == 1 and left.passes[0].endswith("#1")
    assert [e.number for e in evidence.ranks[0].events] == [0]
    assert summary(left) == "1 unfinished loader pass"


def test_the_report_names_the_signal_exit_code_and_where_each_rank_was():
    evidence = _evidence("interrupted")
    report = build_report(evidence, analyze(evidence), version="test", script="train.py", argv=[], duration_s=1.0)
    assert report.outcome == "interrupted"
    assert report.exit_code() == 130
    assert report.exit_code("info") == 130
    interruption = report.to_json()["interruption"]
    assert interruption["signal"] == "SIGINT" and interruption["exit_code"] == 130
    assert interruption["during"] == "run"
    assert set(interruption["ranks"]) == {"0", "1"}
    assert "unfinished loader pass" in interruption["left_out_summary"]


def test_an_interrupt_during_start_up_is_reported_as_such():
    evidence = make_evidence(2, {}, ranks=[], outcome="interrupted",
                             stop=stop_snapshot({}, {}, reason="interrupted", signal="SIGTERM", missing=[0, 1]))
    report = build_report(evidence, analyze(evidence), version="test", script="train.py", argv=[], duration_s=0.5)
    assert report.findings == []
    assert report.interruption["during"] == "start-up"
    assert report.exit_code() == 143


def test_an_interrupted_report_is_not_clean():
    evidence = _evidence("interrupted")
    report = build_report(evidence, analyze(evidence), version="test", script="train.py", argv=[], duration_s=1.0)
    with pytest.raises(AssertionError, match="interrupted by SIGINT"):
        report.assert_clean()
