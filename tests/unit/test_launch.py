"""The launch plan's environment (supervisor/launch.py): OMP_NUM_THREADS is set where torchrun itself
would set it, and nowhere else, so a one-process job, the script's own mp.spawn and an existing launch
run with the intra-op threads they have without ddpdoctor."""

from __future__ import annotations

import pytest

from ddpdoctor.supervisor.config import RunConfig
from ddpdoctor.supervisor.launch import build_plan

SPAWNING = "import torch.multiprocessing as mp\nmp.spawn(print, nprocs=2)\n"


@pytest.fixture
def script(tmp_path):
    def write(source: str = "print('training')\n") -> str:
        path = tmp_path / "train.py"
        path.write_text(source)
        return str(path)
    return write


def _threads(config: RunConfig, script: str, tmp_path) -> str | None:
    return build_plan(config, script, str(tmp_path)).env.get("OMP_NUM_THREADS")


def test_torchrun_with_several_processes_per_node_gets_one_thread_as_torchrun_gives(script, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _threads(RunConfig(script=script(), nproc_per_node=2), script(), tmp_path) == "1"
    replay = RunConfig(script=script(), nproc_per_node=1, one_rank_role="replay")
    assert _threads(replay, script(), tmp_path) == "1"  # the one-process replay runs as its ranks did


def test_one_process_per_node_and_the_scripts_own_spawn_keep_their_threads(script, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _threads(RunConfig(script=script(), nproc_per_node=1), script(), tmp_path) is None
    spawning = script(SPAWNING)
    plan = build_plan(RunConfig(script=spawning, nproc_per_node=2), spawning, str(tmp_path))
    assert plan.mode == "spawn" and "OMP_NUM_THREADS" not in plan.env


def test_the_users_own_setting_is_kept(script, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert _threads(RunConfig(script=script(), nproc_per_node=2), script(), tmp_path) == "4"
