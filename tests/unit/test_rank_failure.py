"""rank-failure: the root cause among the ranks' exceptions, exits and signals."""

from __future__ import annotations

from builders import (SCRIPT, exception, exit_event, failure, init_pg, make_evidence, merge, step, stop_snapshot,
                      sys_exit)

from ddpdoctor.analysis.api import Location
from ddpdoctor.analysis.facts.failures import rank_failures
from ddpdoctor.checks.rank_failure import analyze


def trained(world_size, steps=3):
    """Every rank completed ``steps`` optimizer steps (event t = step number)."""
    return {r: [step(n) for n in range(1, steps + 1)] for r in range(world_size)}


def only_finding(result):
    assert len(result.findings) == 1, result.findings
    return result.findings[0]


def test_root_cause_is_the_non_secondary_exception_not_the_peer_connection_error():
    evidence = make_evidence(2, merge(trained(2), {
        1: [exception("ValueError", "bad batch", t=10.0, step=3, line=42)],
        0: [exception("RuntimeError", "[gloo] Connection closed by peer [10.0.0.2]:1234", t=11.0, step=3, line=77)],
    }), outcome="failed", failures=[failure(0, 1, t=12.0), failure(1, 1, t=11.0)])
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.check == "rank-failure"
    assert finding.severity == "error"
    assert finding.ranks == (1,)
    assert finding.location == Location(SCRIPT, 42)
    assert finding.message == "rank 1 raised ValueError: bad batch after optimizer step 3"
    assert finding.evidence["kind"] == "exception"
    assert finding.evidence["exception"] == "ValueError"
    assert finding.evidence["last_step"] == 3
    assert finding.evidence["secondary"] == [
        {"rank": 0, "kind": "exception", "summary": "RuntimeError: [gloo] Connection closed by peer [10.0.0.2]:1234"}]
    assert result.status == "fail"
    assert result.summary == "rank 1 failed first; rank 0 failed after it"


def test_secondary_error_recorded_earlier_is_still_not_the_root_cause():
    evidence = make_evidence(2, {
        0: [exception("RuntimeError", "Connection closed by peer", t=5.0)],
        1: [exception("ValueError", "bad batch", t=10.0)],
    }, outcome="failed")
    assert only_finding(analyze(evidence)).ranks == (1,)


def test_root_cause_is_the_earliest_of_several_non_secondary_failures():
    evidence = make_evidence(3, {
        0: [exception("KeyError", "'label'", t=12.0)],
        1: [exception("ValueError", "bad batch", t=10.0)],
        2: [exception("DistBackendError", "NCCL communicator was aborted", t=9.0)],
    }, outcome="failed")
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.ranks == (1,)
    assert sorted(s["rank"] for s in finding.evidence["secondary"]) == [0, 2]
    assert result.summary == "rank 1 failed first; ranks 0, 2 failed after it"


def test_when_every_error_is_secondary_the_earliest_is_reported():
    evidence = make_evidence(2, {
        0: [exception("RuntimeError", "Socket Timeout", t=20.0)],
        1: [exception("RuntimeError", "operation timed out", t=15.0)],
    }, outcome="failed")
    assert only_finding(analyze(evidence)).ranks == (1,)


def test_keyboard_interrupt_is_not_the_root_cause():
    evidence = make_evidence(2, {
        0: [exception("KeyboardInterrupt", "", t=1.0)],
        1: [exception("ValueError", "bad batch", t=2.0)],
    }, outcome="failed")
    assert only_finding(analyze(evidence)).ranks == (1,)


def test_sigkill_without_exception_events_names_the_signal_and_last_step():
    evidence = make_evidence(2, trained(2, steps=4), outcome="failed",
                             failures=[failure(1, exitcode=-9, signal="SIGKILL")])
    finding = only_finding(analyze(evidence))
    assert finding.ranks == (1,)
    assert finding.message == "rank 1 was killed by SIGKILL after optimizer step 4"
    assert finding.location is None
    assert finding.evidence["kind"] == "signal"
    assert finding.evidence["signal"] == "SIGKILL"
    assert finding.evidence["exitcode"] == -9
    assert "OOM" in finding.fix


def test_sigterm_failures_are_ignored():
    evidence = make_evidence(2, trained(2), outcome="failed",
                             failures=[failure(0, exitcode=-15, signal="SIGTERM"),
                                       failure(1, exitcode=-9, signal="SIGKILL")])
    finding = only_finding(analyze(evidence))
    assert finding.ranks == (1,)
    assert finding.evidence["secondary"] == []


def test_only_sigterm_failures_mean_no_rank_failed():
    evidence = make_evidence(2, trained(2), outcome="failed",
                             failures=[failure(0, exitcode=-15, signal="SIGTERM"),
                                       failure(1, exitcode=-15, signal="SIGTERM")])
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "no rank failed"


def test_non_zero_exit_code_without_signal_or_exception():
    evidence = make_evidence(2, trained(2), outcome="failed", failures=[failure(1, exitcode=2)])
    finding = only_finding(analyze(evidence))
    assert finding.message == "rank 1 exited with code 2 after optimizer step 3"
    assert finding.evidence["kind"] == "exitcode"
    assert finding.evidence["exitcode"] == 2


def test_failure_rows_without_exit_code_or_signal_are_ignored():
    evidence = make_evidence(2, trained(2), failures=[failure(1, exitcode=0)])
    assert analyze(evidence).findings == []


def test_sys_exit_is_reported_with_its_code_and_location():
    evidence = make_evidence(2, {1: [sys_exit(3, t=4.0, line=50)], 0: []}, outcome="failed",
                             failures=[failure(1, exitcode=3)])
    finding = only_finding(analyze(evidence))
    assert finding.message == "rank 1 called sys.exit(3) before the first optimizer step"
    assert finding.location == Location(SCRIPT, 50)
    assert finding.evidence["kind"] == "exit"
    assert finding.evidence["secondary"] == []  # the exit code row is explained by the sys_exit event


def test_exception_explains_its_own_exit_code_row():
    evidence = make_evidence(2, {1: [exception(t=3.0)], 0: []}, outcome="failed",
                             failures=[failure(1, exitcode=1)])
    finding = only_finding(analyze(evidence))
    assert finding.evidence["kind"] == "exception"
    assert finding.evidence["secondary"] == []


def test_exception_in_the_launcher_process_has_no_rank():
    evidence = make_evidence(2, {}, outcome="failed",
                             unranked=[exception("FileNotFoundError", "no such file: data.csv", t=1.0)])
    finding = only_finding(analyze(evidence))
    assert finding.ranks == ()
    assert finding.message == "the launcher process raised FileNotFoundError: no such file: data.csv"


# -- ddpdoctor stopped the job ---------------------------------------------------------------------

def test_nothing_reported_when_ddpdoctor_stopped_a_hung_job():
    evidence = make_evidence(2, trained(2), outcome="hung", stop=stop_snapshot({0: {}, 1: {}}, {}),
                             failures=[failure(0, exitcode=-9, signal="SIGKILL"), failure(1, exitcode=1)])
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"


def test_kills_are_not_blamed_on_a_rank_when_ddpdoctor_stopped_the_job_at_timeout_or_interrupt():
    for supervisor in ({"outcome": "timeout", "timeout_s": 5.0, "stop": stop_snapshot({}, {}, reason="timeout")},
                       {"outcome": "failed", "stop": stop_snapshot({}, {}, reason="interrupted", signal="SIGINT")}):
        evidence = make_evidence(2, trained(2), failures=[failure(1, exitcode=-9, signal="SIGKILL")], **supervisor)
        for finding in analyze(evidence).findings:
            assert finding.evidence.get("kind") not in ("signal", "exitcode"), (supervisor, finding)
            assert "killed by" not in finding.message, (supervisor, finding)


def test_exceptions_are_still_reported_when_ddpdoctor_stopped_a_hung_job():
    evidence = make_evidence(2, merge(trained(2), {1: [exception("ValueError", "bad batch", t=10.0, step=3)]}),
                             outcome="hung", stop=stop_snapshot({0: {}, 1: {}}, {}),
                             failures=[failure(0, exitcode=-9, signal="SIGKILL")])
    finding = only_finding(analyze(evidence))
    assert finding.ranks == (1,)
    assert finding.evidence["secondary"] == []


def test_clean_run_has_no_failure():
    result = analyze(make_evidence(2, merge(trained(2), {0: [exit_event(0)], 1: [exit_event(0)]})))
    assert result.findings == []
    assert result.status == "pass"


def test_timeout_without_failure_is_reported_as_an_unfinished_job():
    stop = stop_snapshot({0: {"steps": 3, "activity": "training"}, 1: {"steps": 2, "activity": "in all_reduce #7"}},
                         {}, reason="timeout")
    evidence = make_evidence(2, trained(2), outcome="timeout", timeout_s=5.0, stop=stop,
                             failures=[failure(1, exitcode=-9, signal="SIGKILL")])
    finding = only_finding(analyze(evidence))
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert "--timeout 5s" in finding.message


def test_an_interrupted_job_is_no_failure_and_its_keyboard_interrupts_are_not_blamed():
    evidence = make_evidence(2, merge(trained(2), {
        0: [exception("KeyboardInterrupt", "", t=50.0, step=3)],
        1: [exception("RuntimeError", "[gloo] Connection closed by peer [10.0.0.2]:1234", t=49.5, step=3),
            sys_exit(130, t=50.2)],
    }), outcome="interrupted", stop=stop_snapshot({}, {}, reason="interrupted", signal="SIGINT"),
        failures=[failure(0, exitcode=-2, signal="SIGINT"), failure(1, exitcode=143)])
    evidence.stop.t = 50.0
    result = analyze(evidence)
    assert result.findings == []
    assert result.summary == "no rank failed before SIGINT interrupted the run"


def test_a_failure_before_the_interrupt_is_still_reported():
    evidence = make_evidence(2, merge(trained(2), {1: [exception("ValueError", "bad batch", t=10.0, step=3)],
                                                   0: [exception("KeyboardInterrupt", "", t=50.0, step=3)]}),
                             outcome="interrupted", stop=stop_snapshot({}, {}, reason="interrupted", signal="SIGTERM"))
    evidence.stop.t = 50.0
    finding = only_finding(analyze(evidence))
    assert finding.ranks == (1,)
    assert "ValueError" in finding.message


# -- one cause, decoded --------------------------------------------------------------------------------

def test_every_rank_raising_the_same_exception_at_the_same_line_is_one_cause_on_all_ranks():
    evidence = make_evidence(2, merge(trained(2, steps=0), {
        0: [exception("ModuleNotFoundError", "No module named 'timm'", t=2.0, line=3)],
        1: [exception("ModuleNotFoundError", "No module named 'timm'", t=1.0, line=3)],
    }), outcome="failed")
    result = analyze(evidence)
    finding = only_finding(result)
    assert finding.ranks == (0, 1)
    assert finding.message == ("every rank (0, 1) raised ModuleNotFoundError: No module named 'timm' before the "
                               "first optimizer step")
    assert finding.evidence["secondary"] == []
    assert result.summary == "every rank (0, 1) failed"


def test_different_lines_on_different_ranks_are_not_merged():
    evidence = make_evidence(2, {
        0: [exception("ValueError", "bad batch", t=2.0, line=30)],
        1: [exception("ValueError", "bad batch", t=1.0, line=31)],
    }, outcome="failed")
    assert only_finding(analyze(evidence)).ranks == (1,)


NCCL_DUPLICATE_GPU = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
    "NCCL_DEBUG=WARN for details), NCCL version 2.27.5\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
    "Last error:\n"
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000")


def test_nccl_duplicate_gpu_is_decoded_into_one_process_per_gpu():
    evidence = make_evidence(2, {
        0: [init_pg(2, backend="nccl"), exception("DistBackendError", NCCL_DUPLICATE_GPU, t=1.0, line=20)],
        1: [init_pg(2, backend="nccl"), exception("DistBackendError", NCCL_DUPLICATE_GPU, t=1.1, line=20)],
    }, outcome="failed")
    finding = only_finding(analyze(evidence))
    assert finding.ranks == (0, 1)
    assert "two ranks use the same GPU" in finding.message
    assert "Duplicate GPU detected : rank 1 and rank 0" in finding.message
    assert "--nproc-per-node" in finding.fix and "set_device(local_rank)" in finding.fix
    assert finding.evidence["decoded"]["code"] == "duplicate-gpu"


def test_nccl_cause_only_in_the_ranks_output_is_found_there():
    generic = ("NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage (run with NCCL_DEBUG=WARN for details), "
               "NCCL version 2.28.3\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
               "Last error:\n")
    output = ["h100:4242:4242 [0] NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"]
    evidence = make_evidence(2, {1: [exception("DistBackendError", generic, t=1.0)], 0: []}, outcome="failed",
                             output_tails={1: output})
    finding = only_finding(analyze(evidence))
    assert finding.evidence["decoded"]["code"] == "duplicate-gpu"
    assert finding.evidence["decoded"]["detail"].startswith("Duplicate GPU detected")


def test_only_peer_symptoms_say_so():
    evidence = make_evidence(2, {
        0: [exception("DistBackendError", "[gloo] Connection closed by peer [127.0.0.1]:29500", t=5.0)],
        1: [exit_event(0)],
    }, outcome="failed")
    finding = only_finding(analyze(evidence))
    assert finding.evidence["secondary_only"] is True
    assert "no rank reported an error of its own" in finding.message


def test_a_signal_after_the_script_finished_is_a_teardown_crash_not_the_scripts():
    from builders import exit_event

    evidence = make_evidence(2, {0: [exit_event(0)], 1: [exit_event(0)]}, outcome="failed",
                             failures=[failure(1, exitcode=-6, signal="SIGABRT")])
    (finding,) = analyze(evidence).findings
    assert finding.severity == "warning" and finding.ranks == (1,)
    assert "after the script had finished cleanly" in finding.message
    assert rank_failures(evidence) == []


def test_a_rank_gloo_aborted_on_a_collective_mismatch_says_so_instead_of_guessing_a_killer():
    output = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 64 vs 36. Received data size "
              "doesn't match expected size. Is there a distributed collective mismatch in your code?"]
    evidence = make_evidence(2, trained(2, steps=1), outcome="failed", output_tails={1: output},
                             failures=[failure(1, exitcode=-6, signal="SIGABRT")])
    finding = only_finding(analyze(evidence))
    assert finding.message.startswith("rank 1 was killed by SIGABRT: gloo aborted it: a peer sent more or less data "
                                      "into a collective than this rank expected there")
    assert "64 vs 36" in finding.message
    assert finding.evidence["decoded"]["code"] == "collective-mismatch"
    assert "OOM" not in finding.fix and "collective-hang" in finding.fix
