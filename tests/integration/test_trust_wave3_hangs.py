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

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES, once_per_session

sys.path.insert(0, str(Path(__file__).resolve().parent / "fr_harness"))
from fr_launch import run_with_recorder  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.realcode]


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
    # The default (adaptive) threshold: a clean run has nothing to stop, and a short one would report the
    # slow imports of a loaded machine as stalls (a regression that hangs is still stopped, at 30 s).
    run = run_check(EVAL_AT_REBUILD, script_args=("--every-rank-evaluates",))
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
    run = run_check("good_ckpt_barrier.py")  # the default threshold, as in test_every_rank_evaluating_...
    assert run.report is not None, run.output[-3000:]
    assert _found(run) == set(), run.output[-3000:]
    assert run.returncode == 0 and run.report["outcome"] == "completed"


# -- a post-mortem of a rank stuck in its own code -----------------------------------------------------

STUCK = "hang_rank_stuck_in_own_code.py"


@pytest.fixture
def recorded(tmp_path_factory):
    """``recorded(fixture, **options)``: the folder of one plain-torchrun run of the fixture under the
    dump harness (tests/integration/fr_harness, its watchdog's timeout 3 s), made once per session;
    the key of a plain recording is test_postmortem.py's, so both share it."""

    def record(fixture: str, **options) -> Path:
        key = ("recorded", fixture, 2) if not options else ("recorded", fixture, 2, sorted(options.items()))
        with once_per_session(tmp_path_factory, key) as folder:
            dumps = folder / "dumps"
            if not (folder / "done").exists():
                run_with_recorder(fixture, dumps, **options)
                (folder / "done").touch()
        return dumps

    return record


def _analyze(*paths: Path, tmp_path: Path) -> tuple[int, Optional[dict], str]:
    report = tmp_path / "analyze.json"
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "analyze", *map(str, paths), "--json", str(report),
                           "--plain"], capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    return proc.returncode, json.loads(report.read_text()) if report.exists() else None, proc.stdout + proc.stderr


def _found_in(report: dict) -> set[tuple[str, str]]:
    return {(f["check"], f["severity"]) for f in report["findings"]}


def test_dumps_the_watchdog_wrote_prove_the_hang_of_the_rank_stuck_in_its_own_code(recorded, tmp_path):
    """Rank 0's DDP all-reduce #9 outlived its timeout while rank 1, after #8, computed: the job hung on rank 1."""
    code, post, output = _analyze(recorded(STUCK), tmp_path=tmp_path)
    assert code == 1 and post is not None, output[-3000:]
    assert post["outcome"] == "hung"
    assert _found_in(post) == {("collective-hang", "error")}, output[-3000:]
    (root,) = post["findings"]
    assert root["message"].startswith("the job hung: rank 1 never reached the collective rank 0 was waiting in, "
                                      "which timed out after 3s, and the watchdog dumped every rank: "), root["message"]
    assert "rank 1 is not inside a collective: stuck in its own code after _synthetic.py:" in root["message"]
    assert root["ranks"] == [1] and root["evidence"]["culprit"] == 1
    assert root["evidence"]["never_called_by"] == [1] and root["evidence"]["called_by"] == [0]
    assert root["evidence"]["sequence"] == 9 and root["evidence"]["timeout_s"] == 3
    # Rank 1's line is the one its dump records last: its all-reduce #8, in train_step's backward.
    location = root["location"]
    assert (os.path.basename(location["file"]), location["line"]) == \
        ("_synthetic.py", _line_of("_synthetic.py", "loss.backward()"))
    assert {c["check"] for c in root["consequences"]} == set()
    assert "ERROR collective-hang" in output


def test_dumps_ddpdoctor_kept_when_it_stopped_the_stall_itself_prove_no_hang(run_check, tmp_path):
    """The same job stopped by `check` (no progress for 10x --hang-timeout), long before any
    collective's timeout: its dumps show the stall, not a hang, so a warning stays a warning."""
    live = run_check(STUCK, "--hang-timeout", "2")  # test_postmortem's run of it, evidence kept
    kept = Path(live.kept)
    assert {(f["check"], f["severity"]) for f in live.findings()} == {("collective-hang", "warning")}
    code, post, output = _analyze(kept, tmp_path=tmp_path)
    assert post is not None, output[-3000:]
    assert _found_in(post) == {("collective-hang", "warning")}, output[-3000:]
    (finding,) = post["findings"]
    assert finding["evidence"]["kind"] == "no-progress" and "not proven to be a hang" in finding["message"]
    assert code == 1


def test_dumps_of_a_slow_rank_that_arrived_in_time_are_clean(recorded, tmp_path):
    """The known-good twin: rank 0 computes in its own code (a slow read) while rank 1 waits in DDP's
    all-reduce, for 1 s of the watchdog's 3 s; every rank dumps as the job ends."""
    dumps = recorded("good_slow_rank.py", dump_at_exit=True, env_extra={"SLOW_SECONDS": "1"})
    code, post, output = _analyze(dumps, tmp_path=tmp_path)
    assert post is not None, output[-3000:]
    assert _found_in(post) == set(), output[-3000:]
    assert code == 0 and post["outcome"] == "completed"
