"""Probes on torch.distributed collectives: a per-rank trace with sequence numbers and call sites.

Only the outermost call counts (all_gather_object calls all_gather inside), so two ranks that
call the same user-level collectives get the same sequence numbers. No extra communication.
"""

from __future__ import annotations

import ast
import functools
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpdoctor import callsite
from ddpdoctor.probes.patching import patch
from ddpdoctor.recorder import Recorder

TRACED = (
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "reduce", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list", "new_group",
)

_depth = threading.local()


def _describe_tensors(args, kwargs) -> list:
    found = []

    def visit(value):
        if isinstance(value, torch.Tensor):
            found.append([list(value.shape), str(value.dtype).replace("torch.", "")])
        elif isinstance(value, (list, tuple)) and len(found) < 8:
            for item in value[:8]:
                visit(item)

    for value in list(args) + [v for k, v in kwargs.items() if k != "group"]:
        visit(value)
    return found[:8]


@functools.lru_cache(maxsize=256)
def _rank_branches(filename: str) -> tuple[tuple[int, int], ...]:
    """Line ranges of `if` blocks whose condition mentions a rank (e.g. `if rank == 0:`)."""
    try:
        with open(filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "rank" in ast.unparse(node.test).lower():
            ranges.append((node.body[0].lineno, node.end_lineno or node.body[-1].lineno))
    return tuple(ranges)


def in_rank_branch(site: list[dict]) -> bool:
    """Whether any user frame of the call sits inside a rank-dependent branch."""
    return any(lo <= frame["line"] <= hi for frame in site for lo, hi in _rank_branches(frame["file"]))


def _group_ranks(kwargs, args, op: str):
    group = kwargs.get("group")
    if group is None or group is dist.GroupMember.WORLD:
        return None
    try:
        return dist.get_process_group_ranks(group)
    except Exception:
        return "unknown"


def install(rec: Recorder) -> None:
    def make(op: str):
        def wrap(original):
            def traced(*args, **kwargs):
                depth = getattr(_depth, "value", 0)
                if depth or not dist.is_initialized():
                    return original(*args, **kwargs)
                rec.collective_seq += 1
                site = callsite.caller_site(3)
                rec.emit("collective", op=op, n=rec.collective_seq, tensors=_describe_tensors(args, kwargs),
                         group=_group_ranks(kwargs, args, op), site=site, rank_branch=in_rank_branch(site))
                rec.set_activity(f"in {op} #{rec.collective_seq}", site[0] if site else None)
                _depth.value = 1
                try:
                    return original(*args, **kwargs)
                finally:
                    _depth.value = 0
                    rec.set_activity("training")

            return traced

        return wrap

    for op in TRACED:
        for owner in (c10d, dist):
            patch(owner, op, make(op))
