"""The reference job's collective sweep: all_reduce, all_gather and reduce_scatter over growing sizes.

On GPUs 8 B to 1 GiB in powers of 2 (timed with CUDA events); on CPU (gloo) 8 B to 4 MiB in x4
steps with few iterations, so CI covers this code in about a second. Each rank records its own mean
time per call (a ``CollectiveBenchmark`` event, through :mod:`ddpdoctor.rank.publish`); the
analysis side derives bandwidths and names the slowest rank. Sizes follow nccl-tests: ``bytes`` is
the whole buffer (all_reduce's tensor, all_gather's output, reduce_scatter's input).

The calls bypass ddpdoctor's collective probe (one level of its wrapper), whose per-call
bookkeeping would otherwise be timed too; every rank skips the same calls, so the collective
sequence numbers stay aligned.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ddpdoctor.rank import publish
from ddpdoctor.schema.events import CollectiveBenchmark

OPS = ("all_reduce", "all_gather", "reduce_scatter")
GPU_SIZES = tuple(2**e for e in range(3, 31))  # 8 B .. 1 GiB
CPU_SIZES = tuple(2**e for e in range(3, 22, 2)) + (2**22,)  # 8 B .. 2 MiB in x4 steps, then 4 MiB
ELEMENT_BYTES = 4  # float32


def _unprobed(name: str) -> Optional[Callable]:
    """torch.distributed.NAME without ddpdoctor's probe wrapper (torch's own wrappers stay)."""
    fn = getattr(dist, name, None)
    if fn is not None and getattr(fn, "__ddpdoctor_wrapped__", False):
        fn = getattr(fn, "__wrapped__", fn)
    return fn


def _pick(*names: str) -> Optional[Callable]:
    """The first of ``names`` this torch has (torch 2.13 renamed the *_tensor collectives *_single)."""
    return next((fn for fn in map(_unprobed, names) if fn is not None), None)


def _call_for(op: str, size: int, world_size: int, device: torch.device) -> Optional[Callable[[], None]]:
    """A zero-argument call of ``op`` moving ``size`` bytes (nccl-tests' convention), or None when
    the size is too small to split across the ranks."""
    count = size // ELEMENT_BYTES
    if op == "all_reduce":
        tensor = torch.ones(max(count, 1), device=device)
        all_reduce = _unprobed("all_reduce")
        return lambda: all_reduce(tensor)
    per_rank = count // world_size
    if per_rank == 0:
        return None
    if op == "all_gather":
        gather = _pick("all_gather_single", "all_gather_into_tensor")
        output, chunk = torch.empty(per_rank * world_size, device=device), torch.ones(per_rank, device=device)
        return lambda: gather(output, chunk)
    scatter = _pick("reduce_scatter_single", "reduce_scatter_tensor")
    output, full = torch.empty(per_rank, device=device), torch.ones(per_rank * world_size, device=device)
    return lambda: scatter(output, full)


def _bytes_moved(op: str, size: int, world_size: int) -> int:
    count = size // ELEMENT_BYTES
    return max(count, 1) * ELEMENT_BYTES if op == "all_reduce" else (count // world_size) * world_size * ELEMENT_BYTES


def _time_us(call: Callable[[], None], *, warmup: int, iterations: int, cuda: bool) -> float:
    """Mean time of one call on this rank, after warm-up; the ranks start together (a barrier)."""
    for _ in range(warmup):
        call()
    barrier = _unprobed("barrier")
    if cuda:
        torch.cuda.synchronize()
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000 / iterations
    barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - started) * 1e6 / iterations


def run_benchmark(device: torch.device, *, sizes: Optional[tuple[int, ...]] = None,
                  warmup: Optional[int] = None, iterations: Optional[int] = None) -> list[dict]:
    """Sweep every op over ``sizes`` on this rank; returns this rank's rows [{op, bytes, time_us}]
    and records them. Every rank must call it (it is collective)."""
    cuda = torch.ones(1, device=device).is_cuda  # a simulated CUDA device that is really the CPU times as one
    sizes = sizes or (GPU_SIZES if cuda else CPU_SIZES)
    warmup = warmup if warmup is not None else (5 if cuda else 2)
    iterations = iterations if iterations is not None else (20 if cuda else 5)
    world_size = dist.get_world_size()
    rows: list[dict] = []
    skipped: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecation notes of the *_tensor names
        for op in OPS:
            for size in sizes:
                call = _call_for(op, size, world_size, device)
                if call is None:
                    continue
                try:
                    timed = iterations if size <= 2**26 or not cuda else max(3, iterations // 4)
                    time_us = _time_us(call, warmup=warmup, iterations=timed, cuda=cuda)
                except (RuntimeError, NotImplementedError, TypeError) as exc:  # the backend lacks this op
                    skipped.append({"op": op, "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
                    break
                rows.append({"op": op, "bytes": _bytes_moved(op, size, world_size), "time_us": round(time_us, 3)})
    publish.emit(CollectiveBenchmark(backend=str(dist.get_backend()), device=device.type if cuda else "cpu",
                                     world_size=world_size, rows=rows, skipped=skipped,
                                     iterations={"warmup": warmup, "timed": iterations}))
    return rows


def gather_times(rows: list[dict], device: torch.device) -> list[list[float]]:
    """Every rank's times (rank-major), so rank 0 can print a summary without ddpdoctor."""
    mine = torch.tensor([r["time_us"] for r in rows], dtype=torch.float64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    _unprobed("all_gather")(everyone, mine)
    return [t.tolist() for t in everyone]
