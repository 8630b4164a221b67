"""Word sums of many GPU tensors in one kernel launch (Triton), instead of a launch or more each.

A fingerprinted step sums the words of every parameter and gradient (:mod:`ddpdoctor.rank.fingerprint`).
On a GPU, a kernel per tensor costs the host a dispatch and a launch each (about 10-20 µs), three
times per step for each of a GPT's 149 tensors: several milliseconds of host time on a step whose
host work already keeps pace with the device only just, so every millisecond shows in the step.
Here one kernel reads every tensor of a list through a table of their addresses (uploaded from
pinned memory, without a wait) and adds each block's sum into its tensor's total with an integer
atomic: addition modulo 2**64 is associative and commutative, so the totals are exactly the ones
``words.sum()`` gives, in any order of blocks.

Three modes, one pass each: the full sums; the sampled sums (runs of ``run`` words every
``stride`` of a big tensor, small ones whole: ``fingerprint._sampled_word_sum``); both at once.

Used only where Triton imports and the tensors are int64 word views on one CUDA device, and not under
Triton's interpreter (``interpreted_on_host``); any other case, or a failure to compile or launch, leaves
the per-tensor kernels in charge (``available`` returns False from then on, and the optimizer probe
reports the failure as a probe's).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Optional, Sequence

import torch

__all__ = ["DEVICE_TYPES", "MODES", "available", "disable", "failure", "interpreted_on_host", "launch_failure",
           "word_sums"]

MODES = ("full", "sampled", "both")
# Where the fused kernel is used: a GPU. The tests add "cpu" under Triton's interpreter (TRITON_INTERPRET=1).
DEVICE_TYPES: tuple[str, ...] = ("cuda",)
_BLOCK = 1024  # words a program adds per iteration
_ITERS = 16  # iterations per program: 16 Ki words (128 KiB) per program

_kernel = None
_failure: Optional[BaseException] = None  # why there is no fused kernel: no Triton, or a failed launch
_launch_failure: Optional[BaseException] = None  # a compile or launch failure (reported as a probe's)
_lock = threading.Lock()
_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = {}
_ADDRESSES: dict[tuple, torch.Tensor] = {}  # (device, stream, addresses) -> that table on the device
_MAX_ADDRESS_TABLES = 16


def _build_kernel():
    """The Triton kernel, defined on first use: importing Triton costs a second, and never on a CPU."""
    import triton
    import triton.language as tl

    @triton.jit
    def word_sums_kernel(addresses, sizes, block_tensor, block_start, out, out_sampled,
                         SMALL: tl.constexpr, STRIDE: tl.constexpr, RUN: tl.constexpr,
                         MODE: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        # MODE 0: full sums; 1: sampled sums (positions are sample positions of a big tensor);
        # 2: both (out: full, out_sampled: sampled) from one read.
        pid = tl.program_id(0)
        t = tl.load(block_tensor + pid)
        begin = tl.load(block_start + pid)
        n = tl.load(sizes + t)
        base = tl.load(addresses + t).to(tl.pointer_type(tl.int64))
        big = n >= SMALL
        rows = (n - RUN) // STRIDE + 1  # sample rows of a big tensor
        acc = tl.zeros([BLOCK], dtype=tl.int64)
        acc_sampled = tl.zeros([BLOCK], dtype=tl.int64)
        for i in range(ITERS):
            k = begin + i * BLOCK + tl.arange(0, BLOCK)
            if MODE == 1:
                # k counts sampled words of a big tensor (rows * RUN of them), or words of a small one
                limit = tl.where(big, rows * RUN, n)
                offset = tl.where(big, (k // RUN) * STRIDE + k % RUN, k)
                acc += tl.load(base + offset, mask=k < limit, other=0)
            else:
                words = tl.load(base + k, mask=k < n, other=0)
                acc += words
                if MODE == 2:
                    in_sample = ((k % STRIDE) < RUN) & (k < (rows - 1) * STRIDE + RUN)
                    acc_sampled += tl.where(big & ~in_sample, 0, words)
        tl.atomic_add(out + t, tl.sum(acc, axis=0))
        if MODE == 2:
            tl.atomic_add(out_sampled + t, tl.sum(acc_sampled, axis=0))

    return word_sums_kernel


def available() -> bool:
    """Whether Triton can be used (imported and nothing failed so far)."""
    global _kernel, _failure
    if _failure is not None:
        return False
    if _kernel is None:
        with _lock:
            if _kernel is None and _failure is None:
                try:
                    _kernel = _build_kernel()
                except Exception as exc:  # no Triton, or one that does not build this
                    _failure = exc
    return _kernel is not None


_TRUE = ("1", "true", "yes", "on", "y")  # what Triton reads as true in TRITON_INTERPRET


def interpreted_on_host(device: torch.device) -> bool:
    """Whether Triton would run the kernel for ``device``'s tensors in its interpreter, on the host: a GPU's,
    under TRITON_INTERPRET (a script debugging its own kernels). The kernel reads tensors through their
    addresses, which are the device's: the host would dereference them. And once the interpreter has run a
    kernel in a process, torch's second intra-op thread can compute an elementwise op's share differently
    (tests/unit/test_fused_word_sums.py): a probe must not bring that about. The tests' stand-in, the
    interpreter reading CPU tensors (``DEVICE_TYPES`` with "cpu"), reads host memory as it should."""
    return device.type != "cpu" and os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def failure() -> Optional[BaseException]:
    """What made the fused path unavailable, if anything did."""
    return _failure


def disable(exc: BaseException) -> None:
    """No fused kernel from now on in this process: ``exc`` (a compile or launch failure) is why."""
    global _failure, _launch_failure
    _failure = _launch_failure = exc


def launch_failure() -> Optional[BaseException]:
    """The compile or launch failure that disabled the fused kernel, if one did (a missing Triton
    is no failure: the per-tensor kernels are the normal path then)."""
    return _launch_failure


def _table(device: torch.device, sizes: tuple[int, ...], sampled_only: bool, small: int, stride: int, run: int):
    """The per-signature constants on the device: each tensor's word count, and each program's
    tensor and first position (over the sample positions of a big tensor when ``sampled_only``, its
    words otherwise: the full and both modes share a table); cached, since the same tensors come
    every step."""
    key = (device, sizes, sampled_only, small, stride, run)
    cached = _TABLES.get(key)
    if cached is not None:
        return cached
    per_program = _BLOCK * _ITERS
    block_tensor: list[int] = []
    block_start: list[int] = []
    for index, n in enumerate(sizes):
        positions = ((n - run) // stride + 1) * run if sampled_only and n >= small else n
        for begin in range(0, max(positions, 1), per_program):
            block_tensor.append(index)
            block_start.append(begin)
    if len(_TABLES) > 64:
        _TABLES.clear()
    cached = _TABLES[key] = (torch.tensor(sizes, dtype=torch.int64).to(device),
                             torch.tensor(block_tensor, dtype=torch.int32).to(device),
                             torch.tensor(block_start, dtype=torch.int64).to(device), len(block_tensor))
    return cached


def _addresses_on(device: torch.device, addresses: tuple[int, ...], pinned: bool) -> torch.Tensor:
    """The table of ``addresses`` on ``device``, uploaded without a wait; cached, since the same
    parameters (and, mostly, gradient buffers) come every step: an upload is a pinned allocation
    and a copy on the host's side, for a read-only table."""
    # The table is uploaded on the current stream; another stream must not read it before the copy.
    stream = torch.cuda.current_stream(device).cuda_stream if pinned else 0
    key = (device, stream, addresses)
    table = _ADDRESSES.get(key)
    if table is None:
        if len(_ADDRESSES) >= _MAX_ADDRESS_TABLES:
            _ADDRESSES.clear()
        table = _ADDRESSES[key] = torch.tensor(addresses, dtype=torch.int64, pin_memory=pinned).to(
            device, non_blocking=True)
    return table


def word_sums(device: torch.device, addresses: Sequence[int], sizes: Sequence[int], mode: str, *, small: int,
              stride: int, run: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The wrapping int64 sums of the ``sizes[i]`` 64-bit words at ``addresses[i]`` (8-byte aligned
    memory of live tensors on ``device``, at least one word each), launched without waiting:
    (sums, sampled sums or None), one element per address. ``small``, ``stride``, ``run``: the
    sampled fingerprint's parameters (tensors under ``small`` words are summed whole)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    sizes_on_device, table, starts, programs = _table(device, tuple(sizes), mode == "sampled", small, stride, run)
    on_gpu = device.type == "cuda"
    table_of_addresses = _addresses_on(device, tuple(addresses), on_gpu)
    out = torch.zeros(len(sizes), dtype=torch.int64, device=device)
    out_sampled = torch.zeros(len(sizes), dtype=torch.int64, device=device) if mode == "both" else out
    with torch.cuda.device(device) if on_gpu else contextlib.nullcontext():
        _kernel[(programs,)](table_of_addresses, sizes_on_device, table, starts, out,  # type: ignore[index]
                             out_sampled, SMALL=small, STRIDE=stride, RUN=run, MODE=MODES.index(mode),
                             BLOCK=_BLOCK, ITERS=_ITERS)
    return out, out_sampled if mode == "both" else None
