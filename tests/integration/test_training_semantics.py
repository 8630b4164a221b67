"""Jobs that train a different network on each rank, never train the model, or lose DDP's
averaging: what config-sync, optimizer-params and gradient-sync say about them, line by line.

The (check, severity) sets of these fixtures are asserted in test_checks_on_fixtures.py; runs are
shared with it (one run per fixture and options).
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration


def _line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")


def _at(finding: dict, fixture: str, text: str) -> bool:
    location = finding["location"] or {}
    return location.get("file", "").endswith(fixture) and location.get("line") == _line_of(fixture, text)


def test_rank_left_in_eval_mode_names_its_modules_and_the_eval_call(run_check):
    fixture = "bad_config_eval_rank0.py"
    (finding,) = run_check(fixture).findings("config-sync", "error")
    assert "rank 0: BatchNorm1d and Dropout in eval mode (the whole model); rank 1: train mode" in finding["message"]
    assert finding["evidence"]["step"] == 5  # the first step of epoch 1 (4 per epoch and rank)
    assert _at(finding, fixture, "net.eval()  # BUG")


def test_learning_rate_scheduled_on_rank_0_only_names_the_scheduler_line(run_check):
    fixture = "bad_config_lr_by_rank.py"
    run = run_check(fixture)
    (finding,) = run.findings("config-sync", "error")
    assert finding["evidence"]["step"] == 2
    assert "`lr`: rank 0: 0.045; rank 1: 0.05" in finding["message"]
    assert _at(finding, fixture, "scheduler.step()")
    (divergence,) = [c for c in finding["consequences"] if c["check"] == "gradient-sync"]
    assert divergence["evidence"]["case"] == "params-modified"


def test_optimizer_over_an_ema_copy_says_the_weights_never_change(run_check):
    fixture = "bad_optimizer_ema_copy.py"
    (finding,) = run_check(fixture).findings("optimizer-params", "error")
    assert finding["evidence"]["case"] == "model-not-stepped"
    assert "steps 6 tensors that the model's forward never uses" in finding["message"]
    assert "the model's weights never change" in finding["message"]
    assert _at(finding, fixture, "optimizer = torch.optim.SGD(ema.parameters()")


def test_head_replaced_after_the_optimizer_names_the_head_and_the_optimizer_line(run_check):
    fixture = "bad_optimizer_new_head.py"
    (finding,) = run_check(fixture).findings("optimizer-params", "error")
    assert finding["evidence"]["not_stepped"] == ["fc.weight", "fc.bias"]
    assert "replaced after the optimizer was built" in finding["message"]
    assert _at(finding, fixture, "optimizer = torch.optim.SGD(net.parameters()")


def test_weights_loaded_inside_the_loop_are_caught_by_the_backstop(run_check):
    fixture = "bad_optimizer_weights_restored.py"
    (finding,) = run_check(fixture).findings("optimizer-params", "error")
    assert finding["evidence"]["case"] == "weights-restored"
    assert finding["ranks"] == [0, 1]
    assert "never changed" in finding["message"] and "load_state_dict" in finding["message"]


def test_bf16_round_trip_after_wrapping_names_both_conversions(run_check):
    fixture = "bad_grad_bf16_round_trip.py"
    (finding,) = run_check(fixture).findings("gradient-sync", "error")
    to_line, float_line = (_line_of(fixture, "model.to(torch.bfloat16)  # BUG"),
                           _line_of(fixture, "        model.float()"))
    assert (f"`.to(torch.bfloat16)` at {fixture}:{to_line} and `.float()` at {fixture}:{float_line}"
            in finding["message"])
    assert "hooks and buckets still point at the old tensors" in finding["message"]
    assert _at(finding, fixture, "model.to(torch.bfloat16)  # BUG")


def test_device_round_trip_under_the_cuda_simulation_is_reported_as_the_gpu_bug(run_check):
    fixture = "bad_grad_device_round_trip.py"
    run = run_check(fixture)
    (finding,) = run.findings("gradient-sync", "error")
    assert finding["evidence"]["case"] == "device-round-trip"
    assert "CUDA simulation" in finding["message"]
    assert _at(finding, fixture, "model.cpu()  # BUG")
    assert run.report["outcome"] == "completed"


def test_ddp_rewrapped_on_odd_steps_names_the_wrap_and_the_bare_forward(run_check):
    fixture = "bad_grad_ddp_rewrap.py"
    (finding,) = run_check(fixture).findings("gradient-sync", "error")
    wrap_line = _line_of(fixture, "return DistributedDataParallel(net)")
    assert f"{fixture}:{wrap_line}" in finding["message"]
    assert "the forward alternates between a DDP wrapper and the bare module" in finding["message"]
    assert finding["evidence"]["bare_forward"]["file"].endswith("_synthetic.py")


def test_corrupting_comm_hook_is_named_and_no_clipping_advice_is_given(run_check):
    fixture = "bad_grad_comm_hook.py"
    (finding,) = run_check(fixture).findings("gradient-sync", "error")
    assert "`flaky_allreduce`" in finding["message"]
    assert "already differ as they come out of DDP's all-reduce" in finding["message"]
    assert "clip" not in finding["fix"].lower()
    assert _at(finding, fixture, "model.register_comm_hook(")


def test_every_step_names_the_first_divergent_step_and_the_cause_seen_at_the_next_snapshot(run_check):
    """The hook corrupts rank 1's all-reduce from step 13 on. Every step fingerprinted: step 13 is
    reported, with the cause DDP's all-reduce snapshot shows at step 20 (the default schedule's steps
    take it); the default schedule compares step 20 first, and sees the cause there itself."""
    fixture = "bad_grad_comm_hook_late.py"
    (every,) = run_check(fixture, "--fingerprint-every", "1").findings("gradient-sync", "error")
    (default,) = run_check(fixture).findings("gradient-sync", "error")
    for finding in (every, default):
        assert finding["evidence"]["case"] == "comm-hook"
        assert "`failing_allreduce`" in finding["message"]
        assert _at(finding, fixture, "model.register_comm_hook(")
    assert (every["evidence"]["step"], every["evidence"]["last_identical_step"], every["evidence"]["cause_step"]) \
        == (13, 12, 20)
    assert "(seen at optimizer step 20, the first step after 13 with DDP's all-reduce snapshot" in every["message"]
    assert (default["evidence"]["step"], default["evidence"]["last_identical_step"]) == (20, 10)
    assert "cause_step" not in default["evidence"]


def test_bypass_points_at_the_bypassing_forward(run_check):
    fixture = "bad_grad_bypass.py"
    (finding,) = run_check(fixture).findings("gradient-sync", "error")
    assert _at(finding, fixture, "F.cross_entropy(model.module(x)")
