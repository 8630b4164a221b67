"""Collective traces with DDP's own collectives: ranks compared number by number."""

from __future__ import annotations

from builders import collective, frame, init_pg, internal, make_evidence, merge, on_all, stop_snapshot

from ddpdoctor.analysis.collective_trace import first_mismatch, rank_trace
from ddpdoctor.analysis.facts import collectives
from ddpdoctor.checks import collective_hang


def _training(first: int, steps: int, *, forward_line: int = 28, backward_line: int = 30) -> list:
    """`steps` DDP iterations from collective #first: a buffer broadcast (2) in forward, an all-reduce in backward."""
    events = [init_pg(numbering="pg")] if first == 1 else []
    for i in range(steps):
        n = first + 3 * i
        events += [internal(n, 2, "ddp-forward", line=forward_line),
                   internal(n + 2, 1, "ddp-backward", line=backward_line)]
    return events


def test_identical_traces_have_no_mismatch():
    evidence = make_evidence(2, on_all(2, internal(1, 4, "ddp-init"), *_training(5, 3), collective("all_reduce", 14)))
    assert collective_hang.collective_mismatch(evidence) is None
    assert collectives.divergence(evidence) is None
    assert collectives.world_traces(evidence)[0].numbered_to == 14


def test_a_rank_only_ddp_forward_is_the_root_even_without_a_hang():
    rank0 = [*_training(1, 2), internal(7, 2, "ddp-forward", grad=False, line=40), *_training(9, 1)]
    rank1 = [*_training(1, 3)]
    evidence = make_evidence(2, {0: rank0, 1: rank1})
    mismatch = collective_hang.collective_mismatch(evidence)
    assert mismatch.n == 7 and mismatch.culprit() == 0
    result = collective_hang.analyze(evidence)
    (finding,) = result.findings
    assert finding.severity == "error" and finding.location.line == 40
    assert finding.message.startswith("rank 0 ran a forward through the DDP wrapper at train.py:40 that rank 1 "
                                      "never ran")
    assert "from collective #7 on" in finding.message
    assert finding.evidence["rank_only"] == "ddp-forward" and finding.evidence["never_ran"] == [1]
    assert "model.module(x)" in finding.fix


def test_a_user_call_against_ddp_backward_names_the_call():
    rank0 = [*_training(1, 2), collective("all_reduce", 7, line=25, rank_branch=True), *_training(8, 1)]
    rank1 = [*_training(1, 3)]
    (finding,) = collective_hang.analyze(make_evidence(2, {0: rank0, 1: rank1})).findings
    assert finding.location.line == 25
    assert finding.message == ("collective #7 differs across ranks: rank 0 called all_reduce of float32[4] at "
                               "train.py:25, rank 1 issued DDP's forward (its buffer or bucket broadcast) at "
                               "train.py:28")


def test_joins_shadow_collectives_match_any_of_ddps():
    """A joined rank shadows its peers' DDP collectives from Join's hooks: only their count is known."""
    rank0 = [*_training(1, 3)]
    rank1 = [*_training(1, 2), internal(7, 3, "other", ddp=None, line=50)]
    evidence = make_evidence(2, {0: rank0, 1: rank1})
    assert collective_hang.collective_mismatch(evidence) is None


def test_a_forward_in_evaluation_on_every_rank_is_no_mismatch():
    events = [*_training(1, 1), internal(4, 2, "ddp-forward", grad=False, line=40), *_training(6, 1)]
    assert collective_hang.collective_mismatch(make_evidence(2, on_all(2, *events))) is None


def test_a_call_of_several_collectives_is_compared_at_its_first_number():
    events = {0: [collective("all_gather_object", 1, shape=None, units=2), collective("all_reduce", 3)],
              1: [collective("all_gather_object", 1, shape=None, units=2), collective("all_reduce", 3)]}
    assert first_mismatch({r: rank_trace(e) for r, e in events.items()}, include_missing=True) is None


def test_a_trace_cut_at_its_start_is_not_a_mismatch():
    """A flight recorder's full ring buffer loses the first collectives of a rank: nothing to compare there."""
    rank0 = _training(1, 4)
    rank1 = _training(7, 2)
    assert first_mismatch({0: rank_trace(rank0), 1: rank_trace(rank1)}, include_missing=True) is None


def test_hang_names_the_ddp_all_reduce_the_waiting_rank_issued():
    events = merge(on_all(2, *_training(1, 2)), {0: [collective("barrier", 7, shape=None, line=16, rank_branch=True)],
                                                  1: [internal(7, 2, "ddp-forward", line=28),
                                                      internal(9, 1, "ddp-backward", line=30)]})
    stop = stop_snapshot({0: {"activity": "in barrier #7"}, 1: {"activity": "training"}},
                         {0: [frame(16, user=True, function="validate")],
                          1: [frame(30, user=True), frame(1, user=False, file="/venv/torch/autograd/__init__.py")]})
    (finding,) = collective_hang.analyze(make_evidence(2, events, stop=stop, outcome="hung")).findings
    assert finding.location.line == 16
    assert ("first divergence at collective #7: rank 0 called barrier at train.py:16, rank 1 issued DDP's forward "
            "(its buffer or bucket broadcast) at train.py:28") in finding.message
    assert finding.evidence["timeline"]["1"]["6"] == "DDP's gradient all-reduce in the backward pass at train.py:30"
    assert finding.evidence["timeline"]["0"]["7"] == "barrier at train.py:16"
