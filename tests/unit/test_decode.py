"""NCCL and CUDA error texts (as torch and NCCL print them) decoded into causes and fixes."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.decode import decode, last_error_line

NCCL_HEAD = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, {what}, "
             "NCCL version 2.27.5\n")

CAPTURED = {
    # torch 2.x with NCCL 2.2x: the cause in NCCL's "Last error:" line
    "duplicate-gpu": NCCL_HEAD.format(what="invalid usage (run with NCCL_DEBUG=WARN for details)")
    + "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
      "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000",
    # older NCCL reported it as an internal error
    "duplicate-gpu-internal": "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, internal "
    "error, NCCL version 2.14.3\nncclInternalError: Internal check failed.\nLast error:\n"
    "Duplicate GPU detected : rank 0 and rank 4 both on CUDA device 7000",
    "nccl-system-error": NCCL_HEAD.format(what="unhandled system error (run with NCCL_DEBUG=INFO for details)")
    + "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
      "Last error:\nsocketStartConnect: Connect to 10.1.2.3<43531> failed : Software caused connection abort",
    "nccl-remote-error": NCCL_HEAD.format(what="remote process exited or there was a network error")
    + "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
      "Last error:\nNET/IB : Got completion from peer 10.1.2.4<52033> with status=12 opcode=0 len=0 vendor err 129",
    "nccl-cuda-error": NCCL_HEAD.format(what="unhandled cuda error (run with NCCL_DEBUG=INFO for details)")
    + "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
      "Cuda failure 217 'peer access is not supported between these two devices'",
    "cuda-oom": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
    "1.50 GiB is free. Including non-PyTorch memory, this process has 77.60 GiB memory in use.",
    "device-assert": "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported "
    "at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "watchdog-timeout": "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.",
    "invalid-ordinal": "CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?",
    # torch 2.13: an FSDP2-sharded nn.Linear's `.forward(x)` called directly
    "fsdp-forward-bypass": "aten.addmm.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor "
    "to DTensor before calling distributed operators!",
    "negative-index": "Device index must not be negative",  # x.cuda(-1): `--local_rank` left at -1 under torchrun
}


@pytest.mark.parametrize("captured, code, secondary", [
    ("duplicate-gpu", "duplicate-gpu", False),
    ("duplicate-gpu-internal", "duplicate-gpu", False),
    ("nccl-system-error", "nccl-system-error", False),
    ("nccl-remote-error", "nccl-remote-error", True),
    ("nccl-cuda-error", "nccl-cuda-error", False),
    ("cuda-oom", "cuda-oom", False),
    ("device-assert", "device-assert", False),
    ("watchdog-timeout", "nccl-watchdog-timeout", True),
    ("invalid-ordinal", "invalid-device-ordinal", False),
    ("negative-index", "negative-device-index", False),
    ("fsdp-forward-bypass", "fsdp-hooks-bypassed", False),
])
def test_captured_error_texts_decode_to_their_cause(captured, code, secondary):
    decoded = decode(CAPTURED[captured])
    assert decoded is not None
    assert decoded.code == code
    assert decoded.secondary is secondary
    assert decoded.cause and decoded.fix


def test_the_last_error_line_reaches_the_detail():
    assert last_error_line(CAPTURED["nccl-system-error"]).startswith("socketStartConnect: Connect to 10.1.2.3")
    assert decode(CAPTURED["nccl-cuda-error"]).detail == ("Cuda failure 217 'peer access is not supported between "
                                                         "these two devices'")
    assert "1a000" in decode(CAPTURED["duplicate-gpu"]).detail


def test_a_cause_written_only_to_the_ranks_output_is_found_there():
    generic = NCCL_HEAD.format(what="invalid usage (run with NCCL_DEBUG=WARN for details)") + \
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
    output = ["[rank1]: some line", "h100-1:4242:4242 [1] NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both "
              "on CUDA device 1a000"]
    decoded = decode(generic, output)
    assert decoded.code == "duplicate-gpu"
    assert decoded.detail == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
    assert decode(generic).code == "nccl-invalid-usage"


def test_a_forward_that_bypassed_fsdps_hooks_names_the_call_and_the_operator():
    decoded = decode(CAPTURED["fsdp-forward-bypass"])
    assert "without FSDP's pre-forward hook" in decoded.cause
    assert decoded.fix.startswith("Call the module itself (`module(x)`), not `module.forward(x)`")
    assert decoded.detail == "aten.addmm.default got mixed torch.Tensor and DTensor"


def test_a_device_assert_names_the_failed_assertion_from_the_output():
    output = ["../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
              "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed."]
    assert decode("RuntimeError: CUDA error: device-side assert triggered", output).code == "device-assert"


@pytest.mark.parametrize("message", [
    "bad batch", "invalid usage of my own API", "internal error in my parser", "ValueError: out of range",
])
def test_ordinary_errors_are_not_decoded(message):
    assert decode(message) is None


def test_owned_lines_load_typed_with_fields_of_a_newer_writer_dropped():
    """event_from_json(owned=True) builds the event straight from the parsed line, and falls back
    to dropping unknown keys when a newer writer added fields (or kinds with nested records)."""
    from ddpdoctor.schema import events

    save = events.event_from_json({"kind": "save", "path": "/c.pt", "seq_start": 3, "rank": 1}, owned=True)
    assert isinstance(save, events.Save) and save.path == "/c.pt" and save.rank == 1 and save.done is True
    newer = events.event_from_json({"kind": "save", "path": "/c.pt", "from_the_future": 1}, owned=True)
    assert isinstance(newer, events.Save) and newer.path == "/c.pt"
    line = {"kind": "load", "path": "/c.pt", "error": None}
    assert events.event_from_json(dict(line), owned=True) == events.event_from_json(line)


GLOO_ABORT = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
              "op.preamble.length <= op.nbytes. 64 vs 36. Received data size doesn't match expected size. Is there a "
              "distributed collective mismatch in your code?"]


def test_gloos_abort_on_a_size_mismatch_is_a_collective_mismatch_read_from_the_output():
    """gloo's size check throws in its I/O thread: the rank dies of SIGABRT with no Python exception,
    and std::terminate's `what():` line is all that says why."""
    decoded = decode("", GLOO_ABORT)
    assert decoded is not None and decoded.code == "collective-mismatch" and decoded.secondary is False
    assert decoded.detail == ("op.preamble.length <= op.nbytes. 64 vs 36. Received data size doesn't match expected "
                              "size. Is there a distributed collective mismatch in your code?")
    assert decode("", ["terminate called without an active exception"]) is None
