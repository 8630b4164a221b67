"""env-consistency on synthetic evidence, the report's environment field, and the shared-GPU causality rule."""

from __future__ import annotations

from builders import init_pg, make_evidence

from ddpdoctor.analysis.api import Finding
from ddpdoctor.analysis.causality import link
from ddpdoctor.analysis.rank_environments import physical_gpu, rank_environments
from ddpdoctor.checks import env_consistency, rank_failure
from ddpdoctor.rank.probes.environment import driver_from_proc, relevant_variables
from ddpdoctor.schema import events as ev


def environment(host: str = "node0", torch_version: str = "2.13.0", nccl: str = "2.21.5",
                **fields) -> ev.RankEnvironment:
    values = dict(host=host, python_version="3.11.7", torch_version=torch_version, cuda_version="12.4",
                  cudnn_version=90100, nccl_version=nccl, driver_version="550.54.15",
                  variables={"MASTER_ADDR": "node0", "NCCL_DEBUG": "WARN"})
    values.update(fields)
    return ev.RankEnvironment(**values)


def gpus(count: int = 2) -> list[dict]:
    return [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30, "uuid": f"GPU-{i:04d}",
             "pci_bus_id": f"0000:{i + 0x18:02x}:00.0"} for i in range(count)]


def run(per_rank: dict) -> tuple:
    evidence = make_evidence(len(per_rank), per_rank)
    return env_consistency.analyze(evidence), evidence


def test_identical_environments_pass():
    result, evidence = run({r: [init_pg(backend="nccl"), environment(),
                                ev.RankDevices(gpus=gpus(), current_device=r)] for r in range(2)})
    assert result.status == "pass" and result.findings == []
    assert "2 ranks alike" in result.summary and "each on its own GPU" in result.summary
    envs = rank_environments(evidence)
    assert [e["device"]["uuid"] for e in envs] == ["GPU-0000", "GPU-0001"]


def test_torch_version_difference_is_an_error():
    result, _ = run({0: [init_pg(), environment()], 1: [init_pg(), environment(torch_version="2.12.1")]})
    (finding,) = result.findings
    assert finding.severity == "error" and finding.evidence["kind"] == "versions"
    assert "torch 2.12.1 on rank 1" in finding.message or "torch 2.13.0 on rank 0" in finding.message
    assert finding.evidence["torch"] == {"0": "2.13.0", "1": "2.12.1"}


def test_nccl_version_difference_is_an_error_and_cudnn_a_warning():
    result, _ = run({0: [init_pg(), environment()], 1: [init_pg(), environment(nccl="2.18.1", cudnn_version=8902)]})
    assert ({(f.severity, f.evidence["kind"]) for f in result.findings}
            == {("error", "versions"), ("warning", "versions")})
    assert result.status == "fail"


def test_nccl_variables_that_differ_are_a_warning():
    result, _ = run({0: [init_pg(), environment(variables={"NCCL_SOCKET_IFNAME": "eth0"})],
                     1: [init_pg(), environment(variables={})]})
    (finding,) = result.findings
    assert finding.severity == "warning" and finding.evidence["kind"] == "nccl-variables"
    assert finding.evidence["NCCL_SOCKET_IFNAME"] == {"0": "eth0", "1": None}
    assert "NCCL_SOCKET_IFNAME eth0 on rank 0; unset on rank 1" in finding.message


def test_two_ranks_on_one_gpu_of_an_nccl_job_are_an_error():
    per_rank = {r: [init_pg(backend="nccl"), environment(), ev.RankDevices(gpus=gpus(), current_device=0)]
                for r in range(2)}
    per_rank[2] = [init_pg(backend="nccl"), environment(host="node1"), ev.RankDevices(gpus=gpus(), current_device=0)]
    result, _ = run(per_rank)
    (finding,) = result.findings
    assert finding.severity == "error" and finding.evidence["kind"] == "shared-gpu"
    assert finding.ranks == (0, 1), "rank 2 uses GPU 0 of another host"
    assert finding.evidence["gpus"][0]["gpu"] == "GPU-0000"


def test_the_ddp_device_wins_over_the_current_device():
    wrap = lambda r: ev.DDPWrap(device=f"cuda:{r}")  # noqa: E731  device_ids=[local_rank] without set_device
    result, _ = run({r: [init_pg(backend="nccl"), environment(), wrap(r), ev.RankDevices(gpus=gpus(), current_device=0)]
                     for r in range(2)})
    assert result.findings == []


def test_shared_gpu_without_uuids_maps_through_cuda_visible_devices():
    envs = [{"device": {"index": 0}, "variables": {"CUDA_VISIBLE_DEVICES": "2,3"}},
            {"device": {"index": 1}, "variables": {"CUDA_VISIBLE_DEVICES": "3"}}]
    assert physical_gpu(envs[0]) == "GPU 2"
    assert physical_gpu(envs[1]) == "GPU 1"  # an index past the list: the index itself
    assert physical_gpu({"device": {"index": 0}, "variables": {"CUDA_VISIBLE_DEVICES": "3"}}) == "GPU 3"
    assert physical_gpu({"device": None, "variables": {}}) is None


def test_gloo_jobs_may_share_a_gpu():
    result, _ = run({r: [init_pg(backend="gloo"), environment(), ev.RankDevices(gpus=gpus(), current_device=0)]
                     for r in range(2)})
    assert result.findings == []


def test_one_rank_or_no_environment_skips():
    assert run({0: [init_pg(world_size=1), environment()]})[0].status == "skip"
    assert run({0: [init_pg()], 1: [init_pg()]})[0].status == "skip"


def test_the_duplicate_gpu_crash_is_a_consequence_of_the_shared_gpu():
    shared = Finding(check="env-consistency", severity="error", message="ranks share a GPU", fix="set_device",
                     ranks=(0, 1), evidence=env_consistency.SharedGpu())
    crash = Finding(check="rank-failure", severity="error", message="rank 1 raised DistBackendError", fix="...",
                    ranks=(1,), evidence=rank_failure.Failed(decoded={"code": "duplicate-gpu"}, secondary_only=False))
    (root,) = link([crash, shared])
    assert root.check == "env-consistency"
    assert [c.check for c in root.consequences] == ["rank-failure"]
    other = Finding(check="rank-failure", severity="error", message="rank 1 raised ValueError", fix="...",
                    ranks=(1,), evidence=rank_failure.Failed(secondary_only=False))
    assert len(link([other, shared])) == 2, "an unrelated crash stays a root of its own"


def test_probe_helpers():
    assert driver_from_proc("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                            "GCC version:  gcc version 12.2.0") == "550.54.15"
    assert driver_from_proc("") is None
    variables = relevant_variables({"NCCL_IB_HCA": "mlx5", "HOME": "/root", "MASTER_PORT": "29500", "SECRET": "x",
                                    "TORCH_NCCL_BLOCKING_WAIT": "1"})
    assert variables == {"MASTER_PORT": "29500", "NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "1"}
