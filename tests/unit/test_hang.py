"""HangDetector: adaptive and fixed thresholds, stalled ranks, reset. Clock values are passed in."""

from __future__ import annotations

import pytest

from ddpdoctor.schema.observations import Heartbeat
from ddpdoctor.schema.rank_state import live_state
from ddpdoctor.supervisor.hang import MIN_ADAPTIVE_S, STEP_FACTOR, HangDetector, classify


def test_default_threshold_is_30_seconds_before_any_step():
    assert MIN_ADAPTIVE_S == 30.0 and STEP_FACTOR == 10.0
    assert HangDetector().threshold_s() == 30.0


def test_adaptive_threshold_is_ten_times_the_slowest_step():
    d = HangDetector()
    d.observe(0.0, 0, progress=1, steps=0)
    d.observe(10.0, 0, progress=2, steps=1)  # the first step has no start time: not measured
    assert d.threshold_s() == 30.0
    d.observe(15.0, 0, progress=3, steps=2)  # a 5 s step
    assert d.threshold_s() == pytest.approx(50.0)
    d.observe(16.0, 0, progress=4, steps=4)  # two 0.5 s steps do not lower it
    assert d.threshold_s() == pytest.approx(50.0)


def test_fast_steps_keep_the_30_second_floor():
    d = HangDetector()
    for i in range(5):
        d.observe(float(i), 0, progress=i, steps=i)  # 1 s steps: 10 x 1 s < 30 s
    assert d.threshold_s() == 30.0


def test_slowest_step_of_any_rank_counts():
    d = HangDetector()
    d.observe(0.0, 0, 1, 1)
    d.observe(0.0, 1, 1, 1)
    d.observe(2.0, 0, 2, 2)
    d.observe(8.0, 1, 2, 2)  # rank 1: a 8 s step
    assert d.threshold_s() == pytest.approx(80.0)


def test_fixed_threshold_overrides_the_adaptive_one():
    d = HangDetector(hang_timeout_s=5.0)
    d.observe(0.0, 0, 1, 1)
    d.observe(100.0, 0, 2, 2)  # a 100 s step would give 1000 s adaptively
    assert d.threshold_s() == 5.0


def test_job_stall_age_is_the_time_since_any_live_rank_progressed():
    d = HangDetector()
    d.observe(0.0, 0, progress=7, steps=0)
    d.observe(0.0, 1, progress=7, steps=0)
    d.observe(0.0, 2, progress=7, steps=0)
    d.observe(20.0, 1, progress=8, steps=0)
    d.observe(25.0, 0, progress=7, steps=0)  # same progress: still stalled since t=0
    assert d.job_stall_age(31.0, {0, 1, 2}) == pytest.approx(11.0)  # rank 1 progressed at t=20
    assert d.job_stall_age(31.0, {0, 2}) == pytest.approx(31.0)
    assert d.job_stall_age(31.0, {0, 5}) == 0.0  # rank 5 never observed: not judged yet
    assert d.stall_age(31.0, 0) == pytest.approx(31.0)
    assert d.stall_age(31.0, 5) == 0.0


# -- classifying a stalled rank from its stack ----------------------------------------------------------

TORCH = "/venv/lib/python3.11/site-packages/torch"


def frame(file, function, *, user=False, code=""):
    return {"file": file, "line": 1, "function": function, "code": code, "user": user}


def beat(activity="training"):
    return Heartbeat(pid=1, rank=0, activity=activity)


def test_a_traced_collective_in_progress_is_waiting():
    assert classify([frame("/job/train.py", "main", user=True)], beat("in barrier #4")) == ("waiting", "barrier #4")


def test_ddp_backward_is_waiting_for_the_gradient_all_reduce():
    stack = [frame("/job/train.py", "main", user=True), frame(f"{TORCH}/autograd/graph.py", "_engine_run_backward")]
    assert classify(stack, beat()) == ("waiting", "the backward pass (DDP's gradient all-reduce)")


@pytest.mark.parametrize("function, code, expected", [
    ("_pre_forward", "if torch.is_grad_enabled() and self.reducer._rebuild_buckets():", "bucket rebuild"),
    ("_sync_buffers", "self._sync_module_buffers(authoritative_rank)", "buffer broadcast"),
    ("_verify_param_shape_across_processes", "", "parameter shapes"),
])
def test_ddp_internal_waits_are_named(function, code, expected):
    stack = [frame("/job/train.py", "main", user=True),
             frame(f"{TORCH}/nn/parallel/distributed.py", function, code=code)]
    state, what = classify(stack, beat())
    assert state == "waiting" and expected in what


def test_a_large_save_or_a_slow_loader_is_busy_not_waiting():
    save = [frame("/job/train.py", "main", user=True), frame(f"{TORCH}/serialization.py", "_save")]
    assert classify(save, beat())[0] == "busy"
    loader = [frame("/job/train.py", "main", user=True), frame(f"{TORCH}/utils/data/dataloader.py", "_try_get_data"),
              frame("/usr/lib/python3.11/threading.py", "wait")]
    assert classify(loader, beat())[0] == "busy"


def test_the_users_own_code_is_computing():
    assert classify([frame("/job/train.py", "main", user=True)], beat()) == ("computing", None)


def test_a_custom_functions_forward_under_autograd_is_not_the_backward():
    """`torch/autograd/function.py apply` is also a Function's forward: a full state dict gathered on
    one rank only blocks in a DTensor redistribute's all-gather, not in a backward (issue #32)."""
    stack = [frame("/job/train.py", "main", user=True),
             frame(f"{TORCH}/distributed/checkpoint/state_dict.py", "get_model_state_dict"),
             frame(f"{TORCH}/distributed/_state_dict_utils.py", "dtensor_func"),
             frame(f"{TORCH}/distributed/tensor/_api.py", "redistribute"),
             frame(f"{TORCH}/autograd/function.py", "apply"),
             frame(f"{TORCH}/distributed/tensor/_redistribute.py", "forward"),
             frame(f"{TORCH}/distributed/_functional_collectives.py", "wait_tensor"),
             frame(f"{TORCH}/_ops.py", "__call__"),
             frame(f"{TORCH}/_library/autograd.py", "autograd_impl")]
    assert classify(stack, beat()) == ("waiting", "a torch.distributed call (wait_tensor)")
    assert live_state(stack) == ("saving a checkpoint", None)  # get_model_state_dict: torch/distributed/checkpoint


IMPORT = "<frozen importlib._bootstrap>"


def test_a_torch_distributed_module_being_imported_is_busy_not_waiting():
    """torch.distributed.tensor registering its ops at import runs code under torch/distributed but
    calls no collective: a slow import on a loaded machine is not a wait for the peers."""
    stack = [frame("/job/train.py", "main", user=True),
             frame(IMPORT, "_find_and_load"), frame(IMPORT, "_call_with_frames_removed"),
             frame(f"{TORCH}/distributed/tensor/__init__.py", "<module>"),
             frame(IMPORT, "_find_and_load"), frame(IMPORT, "_call_with_frames_removed"),
             frame(f"{TORCH}/distributed/tensor/_ops/_matrix_ops.py", "<module>"),
             frame(f"{TORCH}/distributed/tensor/_ops/utils.py", "register_op_strategy")]
    assert classify(stack, beat()) == ("busy", "an import (torch/distributed/tensor/_ops/_matrix_ops.py) "
                                               "called from train.py:1")
    finding = [frame("/job/train.py", "<module>", user=True), frame(IMPORT, "_find_and_load"),
               frame("<frozen importlib._bootstrap_external>", "_path_stat")]
    assert classify(finding, beat()) == ("busy", "an import (finding the module) called from train.py:1")


def test_ddpdoctors_import_of_dynamo_before_ddps_constructor_is_named_as_the_constructor():
    """The ddp probe imports torch._dynamo (which DDP's constructor imports anyway) and collects what
    the import left: a stall there is the script's DDP(...) call, not a ddpdoctor function name."""
    probe = "/site-packages/ddpdoctor/rank/probes/ddp.py"
    collecting = [frame("/job/train.py", "main", user=True), frame(probe, "__init__"),
                  frame(probe, "_import_dynamo_quietly")]
    expected = "DDP's constructor (importing torch._dynamo) called from train.py:1"
    assert classify(collecting, beat()) == ("busy", expected)


def test_a_collective_that_imports_or_a_users_module_calling_one_at_import_still_waits():
    inside_call = [frame("/job/train.py", "main", user=True),
                   frame(f"{TORCH}/distributed/distributed_c10d.py", "init_process_group"),
                   frame(IMPORT, "_find_and_load"), frame(f"{TORCH}/distributed/rendezvous.py", "<module>")]
    assert classify(inside_call, beat())[0] == "waiting"
    users_module = [frame("/job/train.py", "<module>", user=True), frame(IMPORT, "_find_and_load"),
                    frame("/job/helpers.py", "<module>", user=True),
                    frame(f"{TORCH}/distributed/distributed_c10d.py", "barrier")]
    assert classify(users_module, beat()) == ("waiting", "a torch.distributed call (barrier)")


@pytest.mark.parametrize("entry", [(f"{TORCH}/_tensor.py", "backward"), (f"{TORCH}/autograd/__init__.py", "backward"),
                                   (f"{TORCH}/autograd/__init__.py", "grad"),
                                   (f"{TORCH}/autograd/graph.py", "_engine_run_backward")])
def test_the_backward_is_recognised_by_its_entry_points(entry):
    stack = [frame("/job/train.py", "main", user=True), frame(*entry), frame(f"{TORCH}/autograd/function.py", "apply")]
    assert classify(stack, beat()) == ("waiting", "the backward pass (DDP's gradient all-reduce)")
    assert live_state(stack) == ("computing", "backward")
