"""NCCL and CUDA errors decoded into causes and fixes.

NCCL's exceptions open with a generic line ("NCCL error in: ...ProcessGroupNCCL.cpp:..., invalid
usage ..."); the cause is in the "Last error:" line that follows, or only in the rank's own output
(a ``NCCL WARN`` line) when NCCL_DEBUG is off. This module reads both and names the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

__all__ = ["COLLECTIVE_MISMATCH", "DUPLICATE_GPU", "DecodedError", "decode", "last_error_line"]

COLLECTIVE_MISMATCH = "collective-mismatch"  # the backend itself saw the ranks' collectives differ
DUPLICATE_GPU = "duplicate-gpu"  # NCCL's "Duplicate GPU detected": two ranks on one GPU


@dataclass(frozen=True)
class DecodedError:
    code: str  # short id, e.g. "duplicate-gpu"
    cause: str  # one line: what went wrong, in the user's terms
    fix: str
    detail: Optional[str] = None  # NCCL's "Last error:" line or the matching output line
    secondary: bool = False  # a symptom of another rank's failure, not a cause


@dataclass(frozen=True)
class _Pattern:
    code: str
    regex: re.Pattern[str]
    cause: str
    fix: str
    secondary: bool = False
    nccl_only: bool = False  # generic words ("invalid usage") mean NCCL's error only in an NCCL message


def _p(code: str, pattern: str, cause: str, fix: str, *, secondary: bool = False, nccl_only: bool = False) -> _Pattern:
    return _Pattern(code, re.compile(pattern, re.IGNORECASE), cause, fix, secondary, nccl_only)


_ONE_PROCESS_PER_GPU = ("Run one process per GPU: `--nproc-per-node` equal to the GPUs per node, and call "
                        "`torch.cuda.set_device(local_rank)` (LOCAL_RANK, not RANK) before init_process_group.")

# Most specific first: the first pattern that matches the message or an output line wins.
_PATTERNS = (
    _p("not-simulated", r"(\S+) cannot be simulated on CPU",
       "the script called a CUDA-only API that ddpdoctor's device simulation (GPU script on a CPU-only machine) "
       "has no CPU stand-in for",
       "Run the check on a machine with GPUs (the simulation is off there), or skip this call when "
       "`not torch.cuda.is_available()` or under ddpdoctor (DDPDOCTOR_ACTIVE is set); --device native turns "
       "the simulation off."),
    # FSDP2 all-gathers a module's sharded (DTensor) parameters in its pre-forward hook, which only
    # `module(x)` runs: `module.forward(x)` computes with the shards, which meet plain activations.
    _p("fsdp-hooks-bypassed", r"(\S+) got mixed torch\.Tensor and DTensor",
       "an operator got sharded DTensor parameters together with plain tensors: most often a module sharded with "
       "fully_shard ran without FSDP's pre-forward hook (its `.forward(x)` called directly), so its parameters "
       "were never all-gathered; under tensor parallelism, a plain tensor reached a layer whose plan expects a "
       "DTensor",
       "Call the module itself (`module(x)`), not `module.forward(x)`, so FSDP's hooks all-gather its parameters "
       "first; with tensor parallelism, declare the input layouts in the plan (`PrepareModuleInput`) or pass "
       "DTensors."),
    _p(DUPLICATE_GPU, r"Duplicate GPU detected\s*:\s*rank (\d+) and rank (\d+) both on CUDA device (\w+)",
       "two ranks use the same GPU (NCCL: \"Duplicate GPU detected\"): NCCL needs one process per GPU",
       _ONE_PROCESS_PER_GPU),
    _p("negative-device-index", r"Device index must not be negative|device id must be non-negative",
       "a rank asked for a negative CUDA device index (-1): most often `--local_rank` left at its argparse default, "
       "since torchrun does not pass `--local_rank` (it sets the LOCAL_RANK environment variable)",
       "Read the local rank from the environment: `local_rank = int(os.environ[\"LOCAL_RANK\"])`, and use it for "
       "`torch.cuda.set_device(local_rank)`, `.cuda(local_rank)` and `device_ids=[local_rank]`."),
    _p("invalid-device-ordinal", r"invalid device ordinal",
       "a rank asked for a GPU index that does not exist on its node (more ranks per node than GPUs, or RANK used "
       "where LOCAL_RANK belongs)",
       "Use `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))`, and `--nproc-per-node` at most the GPUs "
       "visible per node (check CUDA_VISIBLE_DEVICES)."),
    _p("cuda-oom", r"CUDA out of memory|OutOfMemoryError|Cuda failure '?out of memory",
       "a rank ran out of GPU memory",
       "Lower the per-rank batch size or sequence length, use gradient accumulation, activation checkpointing or "
       "mixed precision; make sure no two ranks share a GPU and no rank allocates on cuda:0 by accident "
       "(torch.load without map_location, tensors created before set_device)."),
    _p("device-assert", r"device-side assert triggered|Assertion `[^`]*` failed",
       "a CUDA kernel assertion failed (a device-side assert), most often an index out of range: a class label "
       ">= the number of classes, or a token id >= the embedding size",
       "Check the data on the rank that failed (labels, token ids, indices) against the model's sizes; run with "
       "CUDA_LAUNCH_BLOCKING=1 for the exact line, or reproduce on CPU, where the same error names the index."),
    _p("illegal-memory-access", r"an illegal memory access was encountered",
       "a CUDA kernel read or wrote outside its memory (illegal memory access)",
       "Run with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check custom CUDA/Triton kernels and tensors used "
       "after being freed or moved to another device."),
    # gloo checks the size of what a peer sent against what this rank posted for the same
    # collective; a difference is an exception in gloo's I/O thread, which aborts the process.
    _p(COLLECTIVE_MISMATCH, r"Received data size doesn't match expected size|distributed collective mismatch",
       "gloo aborted it: a peer sent more or less data into a collective than this rank expected there, so the "
       "ranks were in different collectives (or the same one with different sizes) at the same point",
       "Make every rank issue the same collectives in the same order with the same sizes; collective-hang names the "
       "first collective where the ranks differ."),
    _p("nccl-watchdog-timeout", r"Watchdog caught collective operation timeout",
       "NCCL's watchdog timed out a collective: the ranks did not all reach it (a hang ended by the backend)",
       "Find the rank that never called the collective (ddpdoctor's collective-hang check, with --hang-timeout, "
       "reports it long before NCCL's timeout).", secondary=True),
    _p("nccl-aborted", r"NCCL communicator was aborted|communicator was aborted",
       "the NCCL communicator was aborted because another rank failed", "Fix the first failure.",
       secondary=True, nccl_only=True),
    _p("nccl-remote-error", r"ncclRemoteError|remote process exited or there was a network error",
       "NCCL lost a peer: another rank exited, or the network between nodes failed",
       "Look for the rank that failed first; if none did, check the network between nodes (NCCL_SOCKET_IFNAME, "
       "InfiniBand state, firewalls).", secondary=True, nccl_only=True),
    _p("nccl-system-error", r"ncclSystemError|unhandled system error",
       "NCCL hit a system error: a socket, shared-memory or device call failed",
       "Check the interface NCCL uses (NCCL_SOCKET_IFNAME), firewalls between nodes, and /dev/shm size in "
       "containers (docker --shm-size / --ipc=host); NCCL_DEBUG=INFO shows the failing call.", nccl_only=True),
    _p("nccl-cuda-error", r"ncclUnhandledCudaError|unhandled cuda error",
       "a CUDA call inside NCCL failed",
       "Read the CUDA error in the detail; NCCL_DEBUG=INFO shows the failing call.", nccl_only=True),
    _p("nccl-invalid-usage", r"ncclInvalidUsage|invalid usage",
       "NCCL rejected how it was used (invalid usage)",
       "Read NCCL's last error below; NCCL_DEBUG=WARN prints it in the rank's output.", nccl_only=True),
    _p("nccl-internal-error", r"ncclInternalError|internal error",
       "NCCL reported an internal error", "Read NCCL's last error below; NCCL_DEBUG=INFO shows more.", nccl_only=True),
)

_NCCL_WARN = re.compile(r"NCCL WARN\s+(.*)")
# std::terminate's report of the C++ exception that aborted the process (gloo's I/O thread).
_TERMINATE = re.compile(r"what\(\):\s+(?:\[[^\]]*\]\s*)?(.*)")


def last_error_line(message: str) -> Optional[str]:
    """The line after NCCL's "Last error:" marker, if there is one and it is not empty."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("Last error:"):
            rest = line.strip()[len("Last error:"):].strip()
            if rest:
                return rest
            following = next((candidate.strip() for candidate in lines[i + 1:] if candidate.strip()), None)
            return following
    return None


def decode(message: str, output: Iterable[str] = ()) -> Optional[DecodedError]:
    """The cause behind an exception message, using the rank's output lines where NCCL put it."""
    last_error = last_error_line(message) or ""
    lines = list(output)
    warnings = [m.group(1).strip() for line in lines for m in [_NCCL_WARN.search(line)] if m]
    aborts = [m.group(1).strip() for line in lines for m in [_TERMINATE.search(line)] if m]
    mentions_nccl = bool(warnings) or "nccl" in message.lower()
    for pattern in _PATTERNS:
        if pattern.nccl_only and not mentions_nccl:
            continue
        for text in (last_error, *warnings, *aborts, message):
            if not text:
                continue
            match = pattern.regex.search(text)
            if match:
                detail = last_error or (text if text in warnings or text in aborts else None) or match.group(0)
                return DecodedError(code=pattern.code, cause=pattern.cause, fix=pattern.fix, detail=detail,
                                    secondary=pattern.secondary)
    return None
