"""Hangs, uneven inputs and crashes: reported with the right ranks and lines, nothing left behind.

Runs that hang use --hang-timeout 5; clean runs keep the default threshold. Latencies are measured in
bench/, never asserted here.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration


def line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")


# fixture -> (line the report must point at, ranks that wait, the root cause, its consequences)
HANGS = {
    "hang_barrier_rank0.py": ("dist.barrier()  # BUG", {0, 1}, "collective-hang", set()),
    "hang_collective_some_ranks.py": ("dist.all_reduce(total)", {0, 1}, "collective-hang", set()),
    # Rank 0 leaves its loop early: the collectives diverge, the batch counts follow from it.
    "early_stop_rank0.py": ("dist.barrier()", {0, 1}, "collective-hang", {"uneven-inputs"}),
    # Rank 1's shard is shorter: the data is the cause, the hang its consequence.
    "uneven_manual_shard.py": ("dist.barrier()", {0, 1}, "uneven-inputs", {"collective-hang"}),
}


@pytest.mark.parametrize("fixture", sorted(HANGS))
def test_hang_is_reported_with_ranks_and_line(run_check, fixture):
    marker, waiting, root, consequences = HANGS[fixture]
    run = run_check(fixture, "--hang-timeout", "5")
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["outcome"] == "hung"
    assert run.found() == {(root, "error")}, run.findings()
    assert {c["check"] for c in run.consequences(root)} == consequences
    (hang,) = run.anywhere("collective-hang", "error")
    assert hang["location"]["file"].endswith(fixture)
    assert hang["location"]["line"] == line_of(fixture, marker)
    states = hang["evidence"]["ranks"]
    assert {int(r) for r, s in states.items() if s["state"] == "waiting"} == waiting
    assert all(s["stack"] for s in states.values()), "every waiting rank's Python stack was collected"


def test_hang_stack_shows_the_blocked_user_frame(run_check):
    """The watchdog reads the main thread's stack while it is blocked inside gloo's C++ barrier."""
    run = run_check("hang_barrier_rank0.py", "--hang-timeout", "5")
    (hang,) = run.findings("collective-hang")
    rank0 = hang["evidence"]["ranks"]["0"]
    assert rank0["where"]["function"] == "validate"
    assert rank0["where"]["line"] == line_of("hang_barrier_rank0.py", "dist.barrier()  # BUG")
    assert any("distributed_c10d.py" in frame for frame in rank0["stack"])


def test_uneven_inputs_names_the_batch_counts(run_check):
    run = run_check("uneven_manual_shard.py", "--hang-timeout", "5")
    (finding,) = run.findings("uneven-inputs", "error")
    assert finding["evidence"]["batches"] == {"0": 11, "1": 10}
    assert finding["evidence"]["outcome"] == "hung"
    assert finding["evidence"]["cause"] == "data"


def test_mismatched_shapes_are_reported_at_their_line(run_check):
    run = run_check("mismatch_shapes.py", "--hang-timeout", "5")
    assert run.returncode == 1
    (finding,) = run.findings("collective-hang", "error")
    assert finding["location"]["line"] == line_of("mismatch_shapes.py", "dist.all_reduce(stats)")
    calls = finding["evidence"]["calls"] if "calls" in finding["evidence"] else None
    assert calls is None or {c["tensors"][0][0][0] for c in calls.values()} == {4, 5}


def test_join_makes_uneven_inputs_clean(run_check):
    # The default (adaptive) threshold: a clean run has no hang to find, and a short one would report a
    # loaded machine's slow imports as stalls (a broken Join would still hang and be stopped, at 30 s).
    run = run_check("good_uneven_join.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == {("uneven-inputs", "info")}, run.findings()


# fault -> (rank, fragment of the message)
FAULTS = {
    "bad_raise_on_rank1.py": (1, "ValueError: bad batch"),
    "sysexit_rank.py": (1, "sys.exit(3)"),
    "kill_rank.py": (1, "SIGKILL"),
    "kill_rank_slow_peer.py": (1, "SIGKILL"),  # torchrun stops rank 0 before it raises
}


@pytest.mark.parametrize("fixture", sorted(FAULTS))
def test_fault_matrix_crashes(run_check, fixture):
    rank, fragment = FAULTS[fixture]
    # The default (adaptive, 30 s) hang threshold: nothing here hangs (the peer fails when the rank
    # leaves, or torchrun stops it), and a 5 s one let a loaded machine's slow start-up (DDP's
    # constructor importing torch._dynamo) be reported as a stall beside the crash.
    run = run_check(fixture)
    # what a failure under load needs to be understood: every finding, its consequences, the output's end
    said = (run.findings(), run.output[-3000:])
    assert run.returncode == 1, said
    assert run.report["outcome"] == "failed", said
    assert run.found() == {("rank-failure", "error")}, said
    (finding,) = run.findings("rank-failure", "error")
    assert finding["ranks"] == [rank], said
    assert fragment in finding["message"], said
    assert finding["evidence"]["last_step"] == 3, said
    # The peer's collective that the crashed rank never joined is the crash's consequence, not a hang.
    assert {c["check"] for c in finding["consequences"]} == {"collective-hang"}, said


def test_a_survivor_torchrun_stopped_first_still_says_where_it_waited(run_check):
    """Stopped by torchrun before its own error (as NCCL's survivors always are), rank 0 was asked
    for a dump first (rank/agent.py): the all-reduce it waited in is in the report."""
    run = run_check("kill_rank_slow_peer.py")
    (finding,) = run.findings("rank-failure", "error")
    (orphan,) = finding["consequences"]
    assert orphan["evidence"]["never_called_by"] == [1], orphan
    assert "rank 0 issued DDP's gradient all-reduce in the backward pass" in orphan["message"], orphan
    assert orphan["message"].endswith("then rank 0 was stopped (SIGTERM) as the job failed"), orphan
    assert run.found() == {("rank-failure", "error")}, run.findings()


def test_fault_matrix_timeout_stops_the_job_and_reports(run_check):
    """The --timeout stop of a job whose ranks sit in mismatched collectives is the hang's consequence."""
    # 25 s: both ranks must reach their mismatched collectives first, which takes over 12 s on a loaded
    # 2-core machine; still below the adaptive hang threshold's 30 s, so the timeout stops the job.
    run = run_check("hang_barrier_rank0.py", "--timeout", "25")
    assert run.returncode == 1
    assert run.report["outcome"] == "timeout"
    assert run.found() == {("collective-hang", "error")}, run.findings()
    (stop,) = [c for c in run.consequences("collective-hang") if c["check"] == "rank-failure"]
    assert "--timeout 25s" in stop["message"]


