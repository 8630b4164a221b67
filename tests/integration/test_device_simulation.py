"""Device simulation: GPU-written fixtures (NCCL, CUDA tensors, torch.cuda / torch.accelerator,
autocast, GradScaler, SyncBatchNorm) run on this CPU-only machine and give the same findings as
their CPU twins (`--cpu`); their known-bad twins (`--bug`) are found under simulation too."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

# fixture -> (ddpdoctor options, the --bug of its known-bad twin, the check it must fail, what it must simulate)
GPU_FIXTURES = {
    "gpu_trainer.py": ((), "set-epoch", "set-epoch",
                       {"nccl->gloo", "torch.cuda.set_device", "cuda modules->cpu", "DDP device_ids->cpu",
                        "torch.load map_location->cpu", "pin_memory->no-op"}),
    "gpu_spawn.py": ((), "no-sampler", "sampler-disjoint",
                     {"nccl->gloo", "torch.cuda.device_count", "torch.cuda.set_device", "DDP device_ids->cpu"}),
    "gpu_multinode.py": (("--nnodes", "2"), "local-rank-save", "rank0-checkpoint",
                         {"nccl->gloo", "torch.cuda.set_device", "cuda modules->cpu", "cuda tensors->cpu"}),
    "gpu_accelerator.py": ((), "module-forward", "gradient-sync",
                           {"nccl->gloo", "torch.accelerator.current_accelerator",
                            "torch.accelerator.set_device_index", "torch.accelerator.synchronize"}),
    "gpu_amp.py": ((), "unused-head", "unused-parameters",
                   {"nccl->gloo", "autocast(cuda)->autocast(cpu, bfloat16)", "GradScaler(cuda)->disabled",
                    "SyncBatchNorm(cuda)->cpu all_reduce", "init_process_group(device_id=cuda)->none",
                    "torch.cuda.synchronize"}),
}


def _shape(run) -> tuple[set, set]:
    """(check, severity) of the top-level findings, and (check, severity) of their consequences."""
    return ({(f["check"], f["severity"]) for f in run.findings()},
            {(c["check"], c.get("severity")) for c in run.consequences()})


@pytest.mark.parametrize("fixture", sorted(GPU_FIXTURES))
def test_gpu_script_runs_clean_under_simulation(run_check, fixture):
    options, _, _, simulated = GPU_FIXTURES[fixture]
    run = run_check(fixture, *options)
    assert run.returncode == 0, run.output[-3000:]
    assert run.serious() == []
    assert run.report["outcome"] == "completed"
    assert run.report["backend"] == "gloo"
    sim = run.report["device_simulation"]
    assert sim["mode"] == "auto" and sim["active"] is True
    assert simulated <= set(sim["simulated"]), sim
    assert sim["unsupported"] == []
    assert "device simulation (auto" in run.output


@pytest.mark.parametrize("fixture", sorted(GPU_FIXTURES))
def test_known_bad_twin_finds_the_same_as_its_cpu_twin(run_check, fixture):
    options, bug, check, _ = GPU_FIXTURES[fixture]
    gpu = run_check(fixture, *options, script_args=("--bug", bug))
    cpu = run_check(fixture, *options, script_args=("--bug", bug, "--cpu"))
    assert gpu.returncode == cpu.returncode == 1, gpu.output[-3000:] + cpu.output[-3000:]
    assert check in gpu.roots() or gpu.anywhere(check), gpu.report["findings"]
    assert _shape(gpu) == _shape(cpu)
    assert gpu.report["device_simulation"]["simulated"]
    assert "nccl->gloo" not in cpu.report["device_simulation"]["simulated"]


def test_native_mode_does_not_simulate(run_check):
    run = run_check("gpu_trainer.py", "--device", "native")
    assert run.returncode == 1
    assert run.report["device_simulation"] == {"mode": "native", "active": False, "ranks": [], "simulated": [],
                                               "calls": {}, "unsupported": [], "ignored": []}
    assert run.findings("rank-failure", "error")
