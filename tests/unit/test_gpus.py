"""The supervisor's GPU count (no torch): the driver's list narrowed by CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from ddpdoctor.supervisor import cli
from ddpdoctor.supervisor.gpus import physical_gpus, visible_gpus


def test_cuda_visible_devices_narrows_the_count_as_cuda_reads_it():
    assert visible_gpus(8, None) == 8
    assert visible_gpus(8, "0,1,2,3") == 4
    assert visible_gpus(8, "") == 0
    assert visible_gpus(8, "-1") == 0
    assert visible_gpus(2, "0,5,1") == 1, "an index past the GPUs ends the list"
    assert visible_gpus(4, "GPU-8f3a,GPU-1b2c") == 2
    assert visible_gpus(0, "0,1") == 0


def test_physical_gpus_from_the_driver_directory(tmp_path):
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (tmp_path / bus).mkdir()
    assert physical_gpus(str(tmp_path)) == 2


def test_the_reference_job_runs_one_rank_per_gpu_else_two(monkeypatch):
    monkeypatch.setattr("ddpdoctor.supervisor.gpus.local_gpu_count", lambda: 8)
    assert cli._reference_nproc(1) == 8 and cli._reference_nproc(2) == 4
    monkeypatch.setattr("ddpdoctor.supervisor.gpus.local_gpu_count", lambda: 0)
    assert cli._reference_nproc(1) == 2
