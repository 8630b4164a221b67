"""Issue #30 item 3: three false verdicts, each fixed at its mechanism, through real torchrun (2
gloo ranks on CPU, GPU scripts under the device simulation).

- datasets each rank builds for itself: positions mean different samples, so overlap is judged by
  content, never by index (good_rank_local_shards.py, bad_rank_local_full_list.py);
- the simulation refuses the device indices CUDA refuses (bad_launch_local_rank_arg.py,
  good_launch_local_rank_env.py);
- nn.DataParallel under torchrun runs as on GPUs and is named as the root (bad_dataparallel_torchrun.py,
  good_ddp_tutorial.py).
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.realcode]


def _line_of(fixture: str, text: str) -> int:
    """The line of ``fixture`` holding ``text`` (exactly one)."""
    lines = [n for n, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1) if text in line]
    assert len(lines) == 1, (fixture, text, lines)
    return lines[0]


def _found(run) -> set[tuple[str, str]]:
    return {(f["check"], f["severity"]) for f in run.findings()}


def _consequences(finding: dict) -> set[str]:
    return {c["check"] for c in finding["consequences"]}


# -- 1. datasets each rank builds for itself --------------------------------------------------------

def test_a_dataset_per_rank_from_its_shard_of_the_files_is_clean(run_check):
    """improved-diffusion's loader: both ranks draw positions 0..127 of their own shard of the files."""
    run = run_check("good_rank_local_shards.py")
    assert _found(run) == set()
    assert run.returncode == 0 and run.report["outcome"] == "completed"
    checks = {c["id"]: c for c in run.report["checks"]}
    assert checks["sampler-disjoint"]["status"] == "pass"
    assert "over datasets each rank built itself" in checks["sampler-disjoint"]["summary"]


def test_every_rank_building_the_dataset_of_all_files_is_still_an_overlap(run_check):
    run = run_check("bad_rank_local_full_list.py")
    assert run.returncode == 1
    assert _found(run) == {("sampler-disjoint", "error")}
    (finding,) = run.findings("sampler-disjoint")
    assert finding["evidence"].get("basis", "indices") == "indices"
    assert "256 of 256 samples" in finding["message"]
    assert finding["location"]["line"] == _line_of("good_rank_local_shards.py", "return DataLoader(dataset")
    assert _consequences(finding) == {"sampler-disjoint"}
    (seen_again,) = finding["consequences"]
    assert seen_again["evidence"]["basis"] == "content" and seen_again["evidence"]["indices"] == "overlapping"


# -- 2. device indices CUDA refuses ------------------------------------------------------------------

def test_launch_era_local_rank_minus_one_fails_at_its_line_as_on_gpus(run_check):
    run = run_check("bad_launch_local_rank_arg.py")
    assert run.returncode == 1 and run.report["outcome"] == "failed"
    assert _found(run) == {("rank-failure", "error")}
    (finding,) = run.findings("rank-failure")
    assert finding["location"]["line"] == _line_of("bad_launch_local_rank_arg.py",
                                                   "nn.Linear(32, 4)).cuda(args.local_rank)")
    assert finding["evidence"]["decoded"]["code"] == "negative-device-index"
    assert "Device index must not be negative" in finding["message"]
    assert 'os.environ["LOCAL_RANK"]' in finding["fix"]
    assert _consequences(finding) == set()


def test_launch_era_script_reading_local_rank_from_the_environment_is_clean(run_check):
    run = run_check("good_launch_local_rank_env.py")
    assert _found(run) == set()
    assert run.returncode == 0 and run.report["outcome"] == "completed"


# -- 3. nn.DataParallel under torchrun ---------------------------------------------------------------

@pytest.mark.parametrize("script_args, kind", [((), "no-process-group"),
                                               (("--init-process-group",), "data-parallel")])
def test_data_parallel_under_torchrun_is_the_one_root_at_its_line(run_check, script_args, kind):
    """The simulation runs DataParallel as a GPU machine would; not-distributed names it, with or
    without a process group, and every process drawing the whole dataset follows from it."""
    run = run_check("bad_dataparallel_torchrun.py", script_args=script_args)
    assert run.returncode == 1 and run.report["outcome"] == "completed"
    assert _found(run) == {("not-distributed", "error")}
    (finding,) = run.findings("not-distributed")
    assert finding["location"]["line"] == _line_of("bad_dataparallel_torchrun.py", "# BUG: DataParallel under torchrun")
    assert finding["evidence"]["kind"] == kind and finding["evidence"]["module"] == "Sequential"
    assert "nn.DataParallel" in finding["message"] and "nothing is averaged across processes" in finding["message"]
    assert "device_ids=[local_rank]" in finding["fix"] and "DistributedSampler" in finding["fix"]
    assert _consequences(finding) == {"sampler-disjoint"}
    assert not any("padd" in c["message"] for c in finding["consequences"])
    assert "DataParallel->module on cpu" in run.report["device_simulation"]["calls"]


def test_the_ddp_version_of_the_tutorial_is_clean(run_check):
    # its --against-one-rank run, which test_global_batch.py reads too: clean with the replay as without
    run = run_check("good_ddp_tutorial.py", "--against-one-rank", "3")
    assert _found(run) == set()
    assert run.returncode == 0 and run.report["outcome"] == "completed"
