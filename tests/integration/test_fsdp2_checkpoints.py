"""rank0-checkpoint on FSDP2 models (issue #32, item 3): torch.distributed.checkpoint saved and
loaded from every rank is clean, and so is a full state dict gathered on every rank (a collective),
saved on rank 0 only and loaded after a barrier; every rank `torch.save`-ing the gathered state to
one path is the same error as DDP's (bad_ckpt_all_ranks_save.py). Real torchrun, 2 gloo ranks on
CPU, assertions through the JSON report."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FSDP2 = "distributed training with FSDP2 on a 1-D mesh of 2"


def _line(fixture: str, text: str) -> int:
    source = (Path(__file__).parents[2] / "fixtures" / fixture).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if text in line]
    return number


def _checks(run) -> dict[str, dict]:
    return {c["id"]: c for c in run.report["checks"]}


def test_dcp_save_and_load_from_every_rank_is_clean(run_check):
    run = run_check("good_fsdp2_dcp_checkpoint.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.found() == set(), run.findings()
    checks = _checks(run)
    assert checks["rank0-checkpoint"]["status"] == "pass"
    # dcp.save and dcp.load on each of the 2 ranks; DCP's own file writes are not torch.save's
    assert checks["rank0-checkpoint"]["summary"] == "0 save(s), 0 load(s), 4 distributed-checkpoint call(s)"
    assert checks["not-distributed"]["summary"] == FSDP2


def test_full_state_dict_saved_on_rank0_after_a_gather_on_every_rank_is_clean(run_check):
    run = run_check("good_fsdp2_full_state_rank0.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.found() == set(), run.findings()
    checks = _checks(run)
    assert checks["rank0-checkpoint"]["status"] == "pass"
    assert checks["rank0-checkpoint"]["summary"] == "1 save(s), 2 load(s)"  # rank 0 writes, both read
    assert checks["collective-hang"]["status"] == "pass"
    assert checks["not-distributed"]["summary"] == FSDP2


def test_every_rank_saving_the_full_state_dict_to_one_path_is_the_ddp_error(run_check):
    fixture = "bad_fsdp2_all_ranks_save.py"
    run = run_check(fixture)
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.found() == {("rank0-checkpoint", "error")}, run.findings()
    (finding,) = run.findings("rank0-checkpoint", "error")
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["file"].endswith(fixture)
    assert finding["location"]["line"] == _line(fixture, "# BUG: every rank writes")
    assert finding["message"].startswith("ranks 0, 1 all wrote ")
    assert finding["message"].endswith("/model.pt: concurrent writers can leave a torn or mixed file")
    assert finding["evidence"]["writes"] == {"0": 1, "1": 1}
    # the gather is a collective: the fix keeps it on every rank and guards only the save
    assert finding["fix"].startswith("Keep gathering the full state dict on every rank")
    assert "put only the torch.save under `if dist.get_rank() == 0:`" in finding["fix"]
    assert _checks(run)["rank0-checkpoint"]["status"] == "fail"
