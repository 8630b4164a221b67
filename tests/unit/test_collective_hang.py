"""collective-hang: mismatched collectives without a hang, and hang explanations."""

from __future__ import annotations

from builders import SCRIPT, collective, exception, frame, init_pg, make_evidence, merge, on_all, stop_snapshot

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.collective_hang import analyze


def traced(world_size, traces, **supervisor):
    return make_evidence(world_size, merge(on_all(world_size, init_pg(world_size)), traces), **supervisor)


# -- mismatch without a hang ------------------------------------------------------------------------

def test_different_shapes_at_the_same_sequence_number_are_an_error():
    result = analyze(traced(2, {
        0: [collective("all_reduce", 1, (10,), line=61), collective("all_reduce", 2, (3,), line=62)],
        1: [collective("all_reduce", 1, (10,), line=61), collective("all_reduce", 2, (4,), line=62)],
    }))
    (finding,) = result.findings
    assert finding.check == "collective-hang"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 62)
    assert finding.message == ("collective #2 differs across ranks: rank 0 called all_reduce of float32[3] at "
                               "train.py:62, rank 1 called all_reduce of float32[4] at train.py:62")
    assert finding.evidence["sequence"] == 2
    assert finding.evidence["calls"]["1"]["tensors"] == [[[4], "float32"]]
    assert result.status == "fail"
    assert result.summary == "collective #2 mismatched"


def test_different_ops_at_the_same_sequence_number_are_an_error():
    (finding,) = analyze(traced(2, {
        0: [collective("broadcast", 1, line=70)],
        1: [collective("all_reduce", 1, line=71)],
    })).findings
    assert "rank 0 called broadcast" in finding.message
    assert "rank 1 called all_reduce" in finding.message
    assert finding.location == Location(SCRIPT, 70)


def test_different_dtypes_are_an_error():
    (finding,) = analyze(traced(2, {
        0: [collective("all_reduce", 1, (4,), "float32")],
        1: [collective("all_reduce", 1, (4,), "float64")],
    })).findings
    assert finding.evidence["sequence"] == 1


def test_matching_traces_are_clean():
    trace = [collective("all_reduce", 1), collective("barrier", 2, shape=None), collective("broadcast", 3)]
    result = analyze(traced(2, {0: trace, 1: trace}))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "6 collectives matched across ranks"


def test_a_rank_that_called_fewer_collectives_is_not_a_mismatch_without_a_hang():
    result = analyze(traced(2, {
        0: [collective("all_reduce", 1), collective("all_reduce", 2)],
        1: [collective("all_reduce", 1)],
    }))
    assert result.findings == []


def test_subgroup_and_point_to_point_collectives_are_not_compared():
    result = analyze(traced(2, {
        0: [collective("all_reduce", 1, (4,), group=[0]), collective("send", 2, (9,)),
            collective("all_reduce", 3, (8,))],
        1: [collective("all_reduce", 1, (7,), group=[1]), collective("recv", 2, (9,)),
            collective("all_reduce", 3, (8,))],
    }))
    assert result.findings == []
    assert result.status == "pass"


# -- hangs -----------------------------------------------------------------------------------------

def hung_in_barrier(**kwargs):
    """Rank 0 waits in a barrier rank 1 never calls; rank 1 computes in user code."""
    hang = stop_snapshot(
        {0: {"activity": "in barrier #3", "steps": 5}, 1: {"activity": "training", "steps": 5}},
        {0: [frame(40, user=True), frame(3000, user=False, function="barrier")],
         1: [frame(50, user=True, function="train_step")]}, **kwargs)
    return traced(2, {
        0: [collective("all_reduce", 1), collective("all_reduce", 2), collective("barrier", 3, shape=None, line=40)],
        1: [collective("all_reduce", 1), collective("all_reduce", 2)],
    }, outcome="hung", stop=hang)


def test_hang_names_the_waiting_rank_and_the_collective_the_other_never_called():
    result = analyze(hung_in_barrier())
    (finding,) = result.findings
    assert finding.check == "collective-hang"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 40)
    assert finding.message == ("the job hung: rank 0 waits in barrier #3 at train.py:40 (main); rank 1 is computing "
                               "in its own code at train.py:50 (train_step); first divergence at collective #3: "
                               "rank 0 called barrier at train.py:40, rank 1 never called collective #3")
    assert finding.evidence["first_divergence"] == 3
    assert finding.evidence["threshold_s"] == 30.0
    states = finding.evidence["ranks"]
    assert states["0"]["state"] == "waiting"
    assert states["0"]["last_collective"]["op"] == "barrier"
    assert states["1"]["state"] == "computing"
    assert result.status == "fail"
    assert result.summary == "job hung (ranks 0, 1)"


def test_hang_names_exited_and_never_started_ranks():
    hang = stop_snapshot(
        {0: {"activity": "in all_reduce #2"}, 1: {"activity": "exited"}},
        {0: [frame(40, user=True), frame(3000, user=False)]}, exited=[1], missing=[2])
    evidence = traced(3, {
        0: [collective("all_reduce", 1), collective("all_reduce", 2, line=44)],
        1: [collective("all_reduce", 1)],
        2: [],
    }, outcome="hung", stop=hang)
    (finding,) = analyze(evidence).findings
    assert finding.ranks == (0, 1, 2)
    assert "rank 1 had already exited" in finding.message
    assert finding.evidence["ranks"]["1"]["state"] == "exited"
    assert finding.evidence["ranks"]["2"] == {"state": "never started"}
    assert finding.evidence["first_divergence"] == 1  # rank 2 never called anything


def test_hang_with_matching_traces_points_at_the_waiting_rank():
    hang = stop_snapshot(
        {0: {"activity": "in all_reduce #1"}, 1: {"activity": "in all_reduce #1"}},
        {0: [frame(77, user=True), frame(1, user=False)], 1: [frame(77, user=True), frame(1, user=False)]})
    trace = [collective("all_reduce", 1)]
    (finding,) = analyze(traced(2, {0: trace, 1: trace}, outcome="hung", stop=hang)).findings
    assert finding.location == Location(SCRIPT, 77)
    assert finding.evidence["first_divergence"] is None
    assert finding.message == ("the job hung: rank 0 waits in all_reduce #1 at train.py:77 (main); "
                               "rank 1 waits in all_reduce #1 at train.py:77 (main)")


def test_timeout_is_not_reported_as_a_hang():
    hang = stop_snapshot({0: {}, 1: {}}, {}, reason="timeout")
    trace = [collective("all_reduce", 1)]
    result = analyze(traced(2, {0: trace, 1: trace}, outcome="timeout", stop=hang))
    assert result.findings == []


# -- not applicable --------------------------------------------------------------------------------

def test_no_process_group_is_skipped():
    result = analyze(make_evidence(2, []))
    assert result.status == "skip"
    assert result.summary == "no process group"


def test_single_process_is_skipped():
    assert analyze(traced(1, {0: [collective("all_reduce", 1)]})).status == "skip"


def test_location_prefers_the_call_made_inside_a_rank_dependent_branch():
    rank0 = collective("all_reduce", 1, line=61, t=1.0)
    rank1 = collective("barrier", 1, shape=None, line=99, t=2.0, rank_branch=True)
    (finding,) = analyze(traced(2, {0: [rank0], 1: [rank1]})).findings
    assert finding.location == Location(SCRIPT, 99)


def test_hang_in_ddp_backward_is_named_from_the_stack():
    hang = stop_snapshot(
        {0: {"activity": "training"}, 1: {"activity": "exited"}},
        {0: [frame(33, user=True), frame(1, user=False, file="/venv/torch/autograd/graph.py", function="backward")]},
        exited=[1])
    trace = [collective("all_reduce", 1)]
    (finding,) = analyze(traced(2, {0: trace, 1: trace}, outcome="hung", stop=hang)).findings
    assert finding.message.startswith("the job hung: rank 0 waits in the backward pass (DDP's gradient all-reduce) "
                                      "at train.py:33 (main)")
    assert finding.location == Location(SCRIPT, 33)


def test_a_collective_that_failed_because_its_peers_had_exited_is_an_error():
    result = analyze(traced(2, {
        0: [collective("broadcast", 1, line=61), collective("barrier", 2, shape=None, line=70),
            exception("RuntimeError", "Connection closed by peer [127.0.0.1]:1234", seq=2)],
        1: [collective("broadcast", 1, line=61)],
    }, outcome="failed"))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.location == Location(SCRIPT, 70)
    assert finding.evidence["never_called_by"] == [1]


def test_a_rank_that_simply_called_more_collectives_without_failing_is_clean():
    result = analyze(traced(2, {
        0: [collective("broadcast", 1, line=61), collective("barrier", 2, shape=None, line=70)],
        1: [collective("broadcast", 1, line=61)],
    }))
    assert result.findings == []


# -- what each rank waits in, and mismatches gloo raises about at once -------------------------------

def test_all_gather_with_a_different_size_per_rank_names_the_op_the_sizes_and_the_line():
    def gather(size):
        return collective("all_gather", 1, line=33, tensors=[[[size], "float32"], [[size], "float32"],
                                                               [[size], "float32"]])
    (finding,) = analyze(traced(2, {
        0: [gather(4), exception("RuntimeError", "Mismatch in buffer sizes", seq=1)],
        1: [gather(5)],
    }, outcome="failed")).findings
    assert finding.evidence["kind"] == "mismatch"
    assert finding.location == Location(SCRIPT, 33)
    assert finding.message == ("collective #1 differs across ranks: rank 0 called all_gather of float32[4] at "
                               "train.py:33, rank 1 called all_gather of float32[5] at train.py:33")


def test_root_only_lists_of_gather_and_scatter_are_not_a_mismatch():
    result = analyze(traced(2, {
        0: [collective("gather", 1, tensors=[[[4], "float32"], [[4], "float32"], [[4], "float32"]])],
        1: [collective("gather", 1, tensors=[[[4], "float32"]])],
    }))
    assert result.findings == []


def test_a_wait_in_ddp_bucket_rebuild_is_not_called_a_buffer_broadcast():
    ddp = "/venv/torch/nn/parallel/distributed.py"
    hang = stop_snapshot(
        {0: {"activity": "training"}, 1: {"activity": "exited"}},
        {0: [frame(33, user=True), frame(1800, user=False, file=ddp, function="forward"),
             frame(1775, user=False, file=ddp, function="_pre_forward",
                   code="if torch.is_grad_enabled() and self.reducer._rebuild_buckets():")]},
        exited=[1])
    (finding,) = analyze(traced(2, {0: [], 1: []}, outcome="hung", stop=hang)).findings
    assert "bucket rebuild" in finding.message
    assert "buffer broadcast" not in finding.message


def test_a_stop_for_no_progress_is_a_warning_not_a_hang():
    hang = stop_snapshot(
        {0: {"activity": "training"}, 1: {"activity": "in barrier #2"}},
        {0: [frame(12, user=True), frame(300, user=False, file="/venv/torch/serialization.py", function="_save")],
         1: [frame(40, user=True), frame(3000, user=False, function="barrier")]}, reason="no-progress")
    (finding,) = analyze(traced(2, {0: [], 1: []}, outcome="hung", stop=hang)).findings
    assert finding.severity == "warning"
    assert finding.evidence["kind"] == "no-progress"
    assert finding.evidence["ranks"]["0"]["state"] == "busy"
    assert "rank 0 is busy in torch.save / torch.load called from train.py:12" in finding.message
    assert "not proven to be a hang" in finding.message


def test_a_stall_that_resolved_is_info():
    stall = stop_snapshot(
        {0: {"activity": "training"}, 1: {"activity": "in barrier #2"}},
        {0: [frame(12, user=True), frame(300, user=False, file="/venv/torch/serialization.py", function="_save")],
         1: [frame(40, user=True), frame(3000, user=False, function="barrier")]}, reason="no-progress")
    trace = [collective("barrier", 1, shape=None), collective("barrier", 2, shape=None)]
    stall.ranks[0].heartbeat.last_collective = {"op": "collective", "n": 1, "site": None}  # as a heartbeat names it
    result = analyze(traced(2, {0: trace, 1: trace}, stalls=[stall]))
    (finding,) = result.findings
    assert finding.severity == "info"
    assert finding.evidence["kind"] == "stall"
    assert result.status == "pass"
    # drawn as a stopped rank is: how long, its last collective then (named from the trace, not the
    # trace's last), and its line in the script
    rank0 = finding.evidence["ranks"]["0"]
    assert rank0["stalled_s"] == 31.0 and rank0["where"]["line"] == 12
    assert (rank0["last_collective"]["n"], rank0["last_collective"]["op"]) == (1, "barrier")


# -- a rank-only forward through DDP that gloo aborts the peer on -----------------------------------

GLOO_ABORT = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 64 vs 36. Received data size "
              "doesn't match expected size. Is there a distributed collective mismatch in your code?"]


def _eval_on_rank0_at_the_rebuild(signal="SIGABRT", **supervisor):
    """Both ranks trained one iteration; then rank 0 alone ran an evaluation forward through DDP
    (collectives #8, #9 at line 39) while rank 1, in its next training forward, died in #8."""
    from builders import failure, internal

    first_iteration = [internal(1, 4, "ddp-init", line=53), internal(5, 2, "ddp-forward", line=61),
                       internal(7, 1, "ddp-backward", line=63)]
    return traced(2, {
        0: [*first_iteration, internal(8, 2, "ddp-forward", line=39, grad=False, training=False),
            exception("RuntimeError", "Read error [127.0.0.1]:41873: Connection reset by peer.", seq=9, line=39)],
        1: list(first_iteration),
    }, outcome="failed", failures=[failure(1, exitcode=-6 if signal == "SIGABRT" else -9, signal=signal, t=5.0)],
        **supervisor)


def test_a_rank_only_ddp_forward_that_gloo_aborted_the_peer_on_is_named_at_its_line():
    (finding,) = analyze(_eval_on_rank0_at_the_rebuild(output_tails={1: GLOO_ABORT})).findings
    assert finding.severity == "error" and finding.location == Location(SCRIPT, 39)
    assert finding.message.startswith("rank 0 ran a forward through the DDP wrapper at train.py:39 that rank 1 never "
                                      "ran: each broadcasts DDP's buffers, a collective the other ranks pair with "
                                      "their own, so its collective #8 met a different collective on rank 1; then "
                                      "gloo aborted rank 1 (SIGABRT): op.preamble.length <= op.nbytes. 64 vs 36.")
    assert finding.evidence["rank_only"] == "ddp-forward" and finding.evidence["never_ran"] == [1]
    assert finding.evidence["sequence"] == 8 and finding.evidence["collectives_from_line"] == {"0": 2, "1": 0}
    assert "model.module(x)" in finding.fix


def test_a_peer_killed_without_gloos_mismatch_message_is_not_called_a_rank_only_forward():
    """A SIGKILL (the OOM killer) says nothing about what the peer was in: the orphan is reported as
    it is, and rank-failure's crash stays the root (the causality pass)."""
    (finding,) = analyze(_eval_on_rank0_at_the_rebuild("SIGKILL")).findings
    assert finding.evidence["kind"] == "orphan" and "rank_only" not in finding.evidence
    assert finding.message.startswith("rank 0 issued DDP's forward (its buffer or bucket broadcast), with no backward "
                                      "to follow (evaluation) at train.py:39 (collective #8) that rank 1 never issued")


# -- a survivor its launcher stopped in the collective its failed peer never joined ----------------

def _rank1_killed_while_rank0_waits_in_backward(*, rank1_failure=None, **supervisor):
    """Both ranks trained one iteration; rank 0's next backward issued DDP's all-reduce #8, which
    rank 1 never issued: rank 1 was killed (or not), and torchrun stopped rank 0 (SIGTERM) before
    its backend raised (NCCL's survivors never notice the dead peer; gloo's may be slower than
    torchrun's 0.1 s poll), after the dump that booked #8 (rank/agent.py)."""
    from builders import failure, internal

    first_iteration = [internal(1, 4, "ddp-init", line=53), internal(5, 2, "ddp-forward", line=61),
                       internal(7, 1, "ddp-backward", line=63)]
    failures = [failure(0, exitcode=-15, signal="SIGTERM", t=5.0)]
    if rank1_failure is not None:
        failures.append(rank1_failure)
    return traced(2, {0: [*first_iteration, internal(8, 1, "ddp-backward", line=63)], 1: list(first_iteration)},
                  outcome="failed", failures=failures, **supervisor)


def test_a_survivor_stopped_in_the_collective_its_killed_peer_never_issued_is_the_orphan():
    from builders import failure

    (finding,) = analyze(_rank1_killed_while_rank0_waits_in_backward(
        rank1_failure=failure(1, exitcode=-9, signal="SIGKILL", t=4.9))).findings
    assert finding.severity == "error" and finding.location == Location(SCRIPT, 63)
    assert finding.evidence["kind"] == "orphan" and finding.evidence["never_called_by"] == [1]
    assert finding.message.endswith("(collective #8) that rank 1 never issued; then rank 0 was stopped (SIGTERM) as "
                                    "the job failed"), finding.message


def test_a_survivor_stopped_without_a_failed_peer_or_by_ddpdoctor_is_no_orphan():
    """Every rank stopped by a SIGTERM from outside (a scheduler's), or ddpdoctor's own stop: the
    rank that is ahead was merely ahead."""
    from builders import failure

    outside = _rank1_killed_while_rank0_waits_in_backward(rank1_failure=failure(1, exitcode=-15, signal="SIGTERM"))
    assert analyze(outside).findings == []
    ours = _rank1_killed_while_rank0_waits_in_backward(
        rank1_failure=failure(1, exitcode=-9, signal="SIGKILL", t=4.9),
        stop=stop_snapshot({0: {}, 1: {}}, {}, reason="interrupted", signal="SIGINT"))
    assert analyze(ours).findings == []
