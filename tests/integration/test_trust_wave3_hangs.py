"""Issue #30 item 3: three hang and abort causes, each named at its mechanism (trust, third wave).

- a rank-0-only forward through the DDP wrapper whose buffer broadcast meets the peer's bucket
  rebuild: gloo aborts the peer, and the root is the forward, not the abort;
- a barrier inside rank 0's save block: one bug, one root (collective-hang at the barrier), never a
  second one on the correct save;
- a post-mortem of a rank stuck in its own code: dumps the watchdog wrote after a collective timed
  out prove the hang (an error naming that rank), dumps without a timeout do not.

Exact finding sets (info included), the root's line and its exact consequences, through the JSON
report. Real torchrun, 2 gloo ranks on CPU.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration


def _line_of(fixture: str, marker: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {fixture}")


def _found(run) -> set[tuple[str, str]]:
    return {(f["check"], f["severity"]) for f in run.findings()}


# -- a rank-0-only forward through DDP at the bucket rebuild ----------------------------------------

EVAL_AT_REBUILD = "bad_eval_rank0_at_bucket_rebuild.py"


def test_a_rank0_only_ddp_forward_that_gloo_aborts_the_peer_on_is_the_root_at_its_line(run_check):
    run = run_check(EVAL_AT_REBUILD, "--hang-timeout", "5")
    assert run.report is not None, run.output[-3000:]
    assert run.returncode == 1 and run.report["outcome"] == "failed", run.output[-3000:]
    assert _found(run) == {("collective-hang", "error")}, run.output[-3000:]
    (root,) = run.findings()
    assert root["location"]["line"] == _line_of(EVAL_AT_REBUILD, "model(val.images)")
    assert root["evidence"]["rank_only"] == "ddp-forward" and root["evidence"]["never_ran"] == [1]
    assert root["message"].startswith(f"rank 0 ran a forward through the DDP wrapper at {EVAL_AT_REBUILD}:")
    assert "gloo aborted rank 1 (SIGABRT)" in root["message"]
    assert "model.module(x)" in root["fix"] and "torch.no_grad()" in root["fix"]
    assert {c["check"] for c in root["consequences"]} == {"rank-failure"}
    (abort,) = root["consequences"]
    assert abort["ranks"] == [1] and "Received data size doesn't match expected size" in abort["message"]


def test_every_rank_evaluating_through_ddp_is_clean(run_check):
    run = run_check(EVAL_AT_REBUILD, "--hang-timeout", "5", script_args=("--every-rank-evaluates",))
    assert run.report is not None, run.output[-3000:]
    assert _found(run) == set(), run.output[-3000:]
    assert run.returncode == 0 and run.report["outcome"] == "completed"


# -- a barrier inside rank 0's save block ----------------------------------------------------------

def test_a_barrier_in_the_rank0_save_block_is_one_root_at_the_barrier(run_check):
    fixture = "bad_ckpt_barrier_in_rank0_block.py"
    run = run_check(fixture, "--hang-timeout", "5")
    assert run.report is not None, run.output[-3000:]
    assert run.returncode == 1, run.output[-3000:]
    assert _found(run) == {("collective-hang", "error")}, run.output[-3000:]
    (root,) = run.findings()
    assert root["location"]["line"] == _line_of(fixture, "dist.barrier()  # BUG")
    # Rank 1's exit usually closes gloo's connection first (rank 0 then fails in the barrier: a
    # peer's symptom, attached); otherwise the hang timeout stops the job with no failure to attach.
    expected = {"rank-failure"} if run.report["outcome"] == "failed" else set()
    assert run.report["outcome"] in ("failed", "hung")
    assert {c["check"] for c in root["consequences"]} == expected
    assert {c["id"]: c["status"] for c in run.report["checks"]}["rank0-checkpoint"] == "pass"


def test_the_barrier_outside_the_save_block_is_clean(run_check):
    run = run_check("good_ckpt_barrier.py", "--hang-timeout", "5")
    assert run.report is not None, run.output[-3000:]
    assert _found(run) == set(), run.output[-3000:]
    assert run.returncode == 0 and run.report["outcome"] == "completed"
