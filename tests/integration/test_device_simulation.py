"""Device simulation: GPU-written fixtures (NCCL, CUDA tensors, torch.cuda / torch.accelerator,
autocast, GradScaler, SyncBatchNorm, transformers models, CUDA generators) run on this CPU-only
machine clean; their known-bad twins (`--bug`) give under simulation exactly the findings their
CPU twins (`--bug ... --cpu`) give: those are written down here rather than run again in every
session (a CPU twin's run costs as much as the simulated one's). An explicit CPU choice of the
launcher or framework turns the simulation off in `auto`, and the report says so."""

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


# The fixtures whose clean version is run as well. A known-bad twin whose finding is exactly its
# root, with no consequence, shows by itself that the simulation raised nothing else: its script is
# the clean one but for the bug, and it simulates the same calls (the recorded reports in
# tests/data/golden agree). A twin that crashes or attaches consequences could hide a false alarm
# among them, so its clean version runs too.
CLEAN_RUNS = ("gpu_amp.py", "gpu_spawn.py")


def _simulated_as_on_a_gpu(run, simulated: set) -> None:
    """The script ran on gloo and CPU tensors in place of NCCL and CUDA, every GPU call it made simulated."""
    assert run.report["outcome"] == "completed"
    assert run.report["backend"] == "gloo"
    sim = run.report["device_simulation"]
    assert sim["mode"] == "auto" and sim["active"] is True
    assert simulated <= set(sim["simulated"]), sim
    assert sim["unsupported"] == []
    assert "device simulation (auto" in run.output


@pytest.mark.parametrize("fixture", CLEAN_RUNS)
def test_gpu_script_runs_clean_under_simulation(run_check, fixture):
    options, _, _, simulated = GPU_FIXTURES[fixture]
    run = run_check(fixture, *options)
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set(), run.findings()
    _simulated_as_on_a_gpu(run, simulated)


# fixture -> what its known-bad twin's CPU twin (--bug BUG --cpu, no simulation) reports, as
# _shape() gives it: (check, severity) of the top-level findings, and of their consequences.
CPU_TWIN_SHAPES = {
    "gpu_trainer.py": ({("set-epoch", "warning")}, set()),
    "gpu_spawn.py": ({("sampler-disjoint", "error")}, {("sampler-disjoint", "error")}),
    "gpu_multinode.py": ({("rank0-checkpoint", "error")}, set()),
    "gpu_accelerator.py": ({("gradient-sync", "error")}, set()),
    "gpu_amp.py": ({("unused-parameters", "error")}, {("gradient-sync", "error"), ("rank-failure", "error")}),
}


@pytest.mark.parametrize("fixture", sorted(GPU_FIXTURES))
def test_known_bad_twin_finds_the_same_as_its_cpu_twin(run_check, fixture):
    options, bug, check, _ = GPU_FIXTURES[fixture]
    gpu = run_check(fixture, *options, script_args=("--bug", bug))
    assert gpu.returncode == 1, gpu.output[-3000:]
    assert check in gpu.roots() or gpu.anywhere(check), gpu.report["findings"]
    assert _shape(gpu) == CPU_TWIN_SHAPES[fixture]
    assert gpu.report["device_simulation"]["simulated"]
    if fixture not in CLEAN_RUNS:  # the twin stands in for its clean version
        assert CPU_TWIN_SHAPES[fixture][1] == set()
        _simulated_as_on_a_gpu(gpu, GPU_FIXTURES[fixture][3])


def test_native_mode_does_not_simulate(run_check):
    run = run_check("gpu_trainer.py", "--device", "native")
    assert run.returncode == 1
    assert run.report["device_simulation"] == {"mode": "native", "active": False, "ranks": [], "simulated": [],
                                               "calls": {}, "unsupported": [], "ignored": [],
                                               "reason": "--device native"}
    assert run.findings("rank-failure", "error")


def _all_findings(run) -> set:
    """(check, severity) of every top-level finding, info included."""
    return {(f["check"], f["severity"]) for f in run.findings()}


def test_a_transformers_script_with_a_cuda_generator_is_simulated_and_its_bug_exactly_a_gradient_sync_error(
        run_check):
    """The known-bad twin (its forward called around DDP) stands in for the clean script, as in
    CLEAN_RUNS: exactly one root, no consequence, every GPU call simulated."""
    run = run_check("gpu_transformers.py", script_args=("--bug", "module-forward"))
    assert run.returncode == 1, run.output[-3000:]
    assert _all_findings(run) == {("gradient-sync", "error")}, run.report["findings"]
    assert run.consequences() == []
    _simulated_as_on_a_gpu(run, {"nccl->gloo", "torch.Generator(cuda)->cpu", "cuda modules->cpu",
                                 "DDP device_ids->cpu", "autocast(cuda)->autocast(cpu, bfloat16)",
                                 "torch.cuda.set_device"})
    assert run.report["device_simulation"]["reason"] == "no GPU visible"


def test_an_explicit_cpu_choice_turns_the_simulation_off(run_check, monkeypatch):
    """The script logs its GPU (with a CUDA-only call) whenever torch.cuda.is_available(): with a
    simulated GPU it crashed, though plain torchrun runs it on the CPU the launcher chose. Every
    variable that says so (tests/unit/test_device_sim.py) is read by the same rank-side choice: one
    is run here, another under the known-bad twin below."""
    variable, value = "ACCELERATE_USE_CPU", "true"
    monkeypatch.setenv(variable, value)
    # run_check shares runs by options and arguments, not by environment: --steps keeps this one apart
    run = run_check("gpu_cpu_choice.py", script_args=("--steps", "6"))
    assert run.returncode == 0, run.output[-3000:]
    assert _all_findings(run) == set(), run.report["findings"]
    sim = run.report["device_simulation"]
    assert sim["mode"] == "auto" and sim["active"] is False and sim["simulated"] == []
    assert sim["reason"].startswith(f"{variable}={value} ") and sim["reason"].endswith("chose the CPU")
    assert f"device simulation off (auto): {variable}={value}" in run.output


def test_under_an_explicit_cpu_choice_the_known_bad_twin_is_exactly_a_gradient_sync_error(run_check, monkeypatch):
    monkeypatch.setenv("LT_ACCELERATOR", "cpu")
    run = run_check("gpu_cpu_choice.py", script_args=("--bug", "module-forward"))
    assert run.returncode == 1, run.output[-3000:]
    assert _all_findings(run) == {("gradient-sync", "error")}, run.report["findings"]
    assert run.report["device_simulation"]["active"] is False


def test_simulate_mode_and_its_old_name_simulate_despite_the_cpu_choice(run_check, monkeypatch):
    """`--device cpu` is `--device simulate`: it overrides the choice, so the GPU-only log is run and
    its CUDA-only call fails as in a CPU-only torch, reported as not simulable."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    run = run_check("gpu_cpu_choice.py", "--device", "cpu")
    assert run.returncode == 1
    sim = run.report["device_simulation"]
    assert sim["mode"] == "simulate" and sim["active"] is True and sim["reason"] == "--device simulate"
    assert sim["unsupported"] == ["torch.cuda.nccl.version"]
    failures = run.findings("rank-failure", "error")
    assert failures and "torch.cuda.nccl.version cannot be simulated on CPU" in failures[0]["message"]
