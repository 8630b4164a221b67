"""Probes on torch.distributed collectives: a per-rank trace with sequence numbers and call sites.

Only the outermost call counts (all_gather_object calls all_gather inside), so two ranks that
call the same user-level collectives get the same sequence numbers. The group is found however it
was passed (``dist.barrier(group)``, ``dist.all_reduce(t, op, group)``), so subgroup collectives
are never mistaken for world collectives. No extra communication.

FSDP (``fully_shard`` and FullyShardedDataParallel) issues its parameter all-gathers and gradient
reduce-scatters through these same functions, from its forward and backward hooks: such a call is
traced like the script's own, marked with its FSDP phase (:attr:`Collective.phase`) and booked to
the user's line that caused it (the forward, ``loss.backward()``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
import threading
from types import FrameType
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpdoctor.rank import callsite
from ddpdoctor.rank.clock import units_of
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import FSDP_STATE_DICT_FILES, Collective, InternalPhase

PROBE = "collectives"

TRACED = (
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "reduce", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list", "new_group",
)
# torch 2.13's names (all_gather_into_tensor and reduce_scatter_tensor now call them; FSDP2 calls
# them directly), traced where this torch has them.
NEWER = ("all_gather_single", "reduce_scatter_single")
MAX_TENSORS = 8

_depth = threading.local()
_FSDP_DIR = os.sep + os.path.join("torch", "distributed", "fsdp") + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # ddpdoctor/rank/
_last_fsdp_site: list = []  # the last FSDP call's user line: for backward hooks run on autograd's own threads


def _graph_task_running() -> bool:
    """Whether autograd is running a backward pass in this thread (its hooks are)."""
    try:
        return torch._C._current_graph_task_id() != -1
    except Exception:
        return False




def _in_state_dict(frame: Optional[FrameType]) -> bool:
    """Whether FSDP's state-dict code is among the callers (a few dozen frames up, FSDP's calls only)."""
    for _ in range(40):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if _FSDP_DIR in name and name.endswith(FSDP_STATE_DICT_FILES):
            return True
        frame = frame.f_back
    return False


def fsdp_phase(frame: Optional[FrameType]) -> Optional[str]:
    """The FSDP phase of a traced call whose caller (``frame``, ddpdoctor's own wrappers skipped) is
    FSDP's code: its backward hooks when autograd runs a backward, its state-dict gathering, else its
    forward hooks. None when the call is not FSDP's."""
    for _ in range(4):
        if frame is None or not frame.f_code.co_filename.startswith(_OWN_DIR):
            break
        frame = frame.f_back
    if frame is None or _FSDP_DIR not in frame.f_code.co_filename:
        return None
    if _graph_task_running():
        return InternalPhase.FSDP_BACKWARD.value
    return InternalPhase.FSDP_STATE_DICT.value if _in_state_dict(frame) else InternalPhase.FSDP_FORWARD.value


def describe_tensors(values: list) -> list:
    """[[shape], dtype] of every tensor among ``values`` (lists of tensors included), up to 8."""
    found: list = []

    def visit(value) -> None:
        if len(found) >= MAX_TENSORS:
            return
        if isinstance(value, torch.Tensor):
            found.append([list(value.shape), str(value.dtype).replace("torch.", "")])
        elif isinstance(value, (list, tuple)):
            for item in value[:MAX_TENSORS]:
                visit(item)

    for value in values:
        visit(value)
    return found


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


def group_ranks(group) -> Optional[object]:
    """None for the world group, else the group's global ranks ("unknown" if torch cannot say)."""
    if group is None or group is dist.GroupMember.WORLD:
        return None
    try:
        return dist.get_process_group_ranks(group)
    except Exception:
        return "unknown"


def _binder(original: Callable) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(original)
    except (TypeError, ValueError):
        return None


def install(rec: Recorder) -> None:
    def make(op: str):
        def wrap(original):
            signature = _binder(original)

            def record(args, kwargs) -> tuple:
                """Write the call before it runs (a call that hangs is in the trace); returns what
                after_call needs: (n, predicted units, the sequence number before, the subgroup's
                ranks or None for the world group)."""
                arguments = dict(kwargs)
                if signature is not None:
                    try:
                        arguments = signature.bind_partial(*args, **kwargs).arguments
                    except TypeError:
                        arguments = dict(kwargs)
                values = ([v for k, v in arguments.items() if k != "group"] if signature
                          else list(args) + list(kwargs.values()))
                ranks = group_ranks(arguments.get("group"))
                group = None if ranks is None else tuple(ranks) if isinstance(ranks, list) else (ranks,)
                units = predicted_units(op)
                n, before = rec.clock.before_call(op, units, group=group)
                site = callsite.caller_site(3)
                phase = fsdp_phase(sys._getframe(2))  # record <- traced <- its caller
                if phase is not None:  # FSDP's: the user's line; a backward on autograd's threads has none
                    if site:
                        _last_fsdp_site[:] = site
                    else:
                        site = list(_last_fsdp_site)
                rec.emit(Collective(op=op, n=n, tensors=describe_tensors(values), group=ranks, site=site,
                                    rank_branch=phase is None and in_rank_branch(site), units=units,
                                    pg_seq=None if before is None else before + 1, phase=phase))
                where = site[0] if site else None
                if group is None:
                    rec.last_collective = {"op": op, "n": n, "site": where}
                part_of = f" in {InternalPhase(phase).part_of}" if phase is not None else ""
                rec.set_activity(f"in {op} #{n}{part_of}", where)
                return n, units, before, group

            def traced(*args, **kwargs):
                if getattr(_depth, "value", 0) or not dist.is_initialized():
                    return original(*args, **kwargs)
                token = None
                try:
                    token = record(args, kwargs)
                except Exception as exc:
                    rec.probe_failed(PROBE, exc, target=op)
                _depth.value = 1
                try:
                    return original(*args, **kwargs)
                finally:
                    _depth.value = 0
                    if token is not None:
                        with rec.guard(PROBE, op):
                            n, units, before, group = token
                            rec.clock.after_call(op, n, units, before, group=group)
                    rec.set_activity("training")

            return traced

        return wrap

    for op in TRACED + tuple(op for op in NEWER if hasattr(c10d, op)):
        for owner in (c10d, dist):
            patch(rec, PROBE, owner, op, make(op))


# Calls that issue two collectives (the sizes, then the data), as torch 2.x implements them.
_TWO_UNITS = frozenset({"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"})


def predicted_units(op: str) -> int:
    """How many collectives a call will take in the numbering, written before it runs (the
    analysis counts the real span from the next numbered call)."""
    if op in _TWO_UNITS:
        return 2
    return units_of(op, 1)
