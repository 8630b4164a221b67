"""What a simulated GPU says about itself: its properties and an empty caching allocator.

Answers are harmless constants in the shapes torch gives them: an A100-like capability (8.0, so
bf16 and TF32 paths are taken as on a current GPU), 80 GiB free, and allocator statistics with
every key torch's ``memory_stats`` has, all zero, so ``memory_stats()["allocated_bytes.all.peak"]``
and torch's own ``memory_summary`` work.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

NAME = "ddpdoctor simulated GPU (CPU)"
TOTAL_MEMORY = 80 * 1024 ** 3
CAPABILITY = (8, 0)

_POOL_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
               "active_bytes", "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "large_pool", "small_pool")
_COUNTS = ("current", "peak", "allocated", "freed")
_SCALARS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
            "max_split_size")


def device_properties(index: int) -> SimpleNamespace:
    """``torch.cuda.get_device_properties(index)``."""
    return SimpleNamespace(
        name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=TOTAL_MEMORY, multi_processor_count=1,
        is_integrated=False, is_multi_gpu_board=False, max_threads_per_multi_processor=2048,
        max_threads_per_block=1024, regs_per_multiprocessor=65536, warp_size=32, L2_cache_size=0,
        shared_memory_per_block=49152, shared_memory_per_multiprocessor=167936,
        shared_memory_per_block_optin=166912, clock_rate=0, memory_clock_rate=0, memory_bus_width=0,
        uuid=f"ddpdoctor-simulated-{index}", pci_bus_id=index, pci_device_id=0, pci_domain_id=0, gcnArchName="")


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """``torch.cuda.memory_stats``: torch's keys, all zero (nothing lives in GPU memory)."""
    stats: collections.OrderedDict[str, int] = collections.OrderedDict()
    for stat in _POOL_STATS:
        for pool in _POOLS:
            for count in _COUNTS:
                stats[f"{stat}.{pool}.{count}"] = 0
    for stat in ("oversize_allocations", "oversize_segments"):
        for count in _COUNTS[:2] + _COUNTS[2:]:
            stats[f"{stat}.{count}"] = 0
    for name in _SCALARS:
        stats[name] = 0
    return collections.OrderedDict(sorted(stats.items()))


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    nested: dict = {}
    for key, value in memory_stats().items():
        node = nested
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return TOTAL_MEMORY, TOTAL_MEMORY
