"""Collective bandwidth as nccl-tests defines it, and the report's ``collective_benchmark`` field.

algbw = bytes / time. busbw = algbw x a factor that makes it comparable with the hardware's peak
link bandwidth whatever the world size: 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
reduce_scatter. ``bytes`` is the whole buffer (all_reduce's tensor, all_gather's output,
reduce_scatter's input), as in nccl-tests. ``time_us`` is the mean over ranks of each rank's mean
time per call (nccl-tests' default, ``-a 1``); the slowest rank is named next to it. GB/s are 1e9
bytes per second.
"""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.schema.events import CollectiveBenchmark

__all__ = ["bus_factor", "bandwidths", "collective_benchmark", "peak_busbw", "SIZE_CONVENTION"]

SIZE_CONVENTION = ("bytes: the whole buffer, as nccl-tests counts it (all_reduce: the tensor; all_gather: the "
                   "gathered output; reduce_scatter: the input)")
TIME_CONVENTION = "time_us: mean over ranks of each rank's mean time per call, after warm-up (nccl-tests -a 1)"


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` on ``world_size`` ranks."""
    n = max(world_size, 1)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus bandwidth factor for {op!r}")


def bandwidths(op: str, num_bytes: int, time_us: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second)."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = num_bytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * bus_factor(op, world_size)


def collective_benchmark(evidence: Evidence) -> Optional[dict[str, Any]]:
    """The report field: {backend, device, world_size, rows: [{op, bytes, time_us, algbw_gbps,
    busbw_gbps, slowest_rank, slowest_host, slowest_time_us}], skipped}; None when no rank ran it."""
    per_rank = {rank: event for rank, event in evidence.events(CollectiveBenchmark)}  # the last one per rank
    if not per_rank:
        return None
    first = per_rank[min(per_rank)]
    world_size = first.world_size or len(per_rank)
    times: dict[tuple[str, int], dict[int, float]] = {}
    for rank, event in sorted(per_rank.items()):
        for row in event.rows:
            times.setdefault((row["op"], int(row["bytes"])), {})[rank] = float(row["time_us"])
    rows = []
    for (op, num_bytes), by_rank in times.items():
        mean = sum(by_rank.values()) / len(by_rank)
        slowest = max(by_rank, key=lambda r: (by_rank[r], -r))
        algbw, busbw = bandwidths(op, num_bytes, mean, world_size)
        ev = evidence.ranks.get(slowest)
        rows.append({"op": op, "bytes": num_bytes, "time_us": round(mean, 3), "algbw_gbps": round(algbw, 4),
                     "busbw_gbps": round(busbw, 4), "slowest_rank": slowest,
                     "slowest_host": ev.host if ev is not None else None,
                     "slowest_time_us": round(by_rank[slowest], 3), "ranks_timed": len(by_rank)})
    skipped = {s["op"]: s["reason"] for event in per_rank.values() for s in event.skipped}
    return {"backend": first.backend, "device": first.device, "world_size": world_size, "rows": rows,
            "skipped": [{"op": op, "reason": reason} for op, reason in skipped.items()],
            "iterations": first.iterations, "ranks": sorted(per_rank), "conventions": [SIZE_CONVENTION,
                                                                                        TIME_CONVENTION]}


def peak_busbw(benchmark: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per op, the row with the highest bus bandwidth (usually the largest size)."""
    peaks: dict[str, dict[str, Any]] = {}
    for row in benchmark.get("rows", []):
        if row["op"] not in peaks or row["busbw_gbps"] > peaks[row["op"]]["busbw_gbps"]:
            peaks[row["op"]] = row
    return peaks
