"""One flight recorder dump -> the evidence events a live ``ddpdoctor check`` rank writes.

The live probes number a rank's world-group collectives by the backend's own sequence number
(``Collective.n`` = the flight recorder's ``collective_seq_id``) and book what no traced Python call
made (DDP's constructor, forward and backward) as :class:`InternalCollectives`. This module makes
the same events from a dump's entries, so the same checks run on both:

- a *traced call* is an entry under a public ``torch.distributed`` function (the outermost one in
  the stack, as the live probe counts only the outermost call): a :class:`Collective`, its op the
  function the script called, its site the script's frames around it. A call that issued several
  collectives (``all_gather_object``: 2) is one event of as many ``units``;
- every other entry is DDP's own or a library's: :class:`InternalCollectives`, in runs of one
  phase and site, with each collective's op and tensors in ``ops``;
- subgroup entries are :class:`Collective` events with ``group`` the subgroup's global ranks
  (a list the caller fills once every dump is read), numbered by their group's sequence;
- point-to-point entries (NCCL records them, gloo does not) take no number, as live.

What a dump cannot show is said, never guessed: entries lost to a full ring buffer, send/recv that
gloo leaves out (a gap in ``op_id``), JSON dumps without Python stacks.
"""

from __future__ import annotations

import ast
import functools
import operator
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ddpdoctor.postmortem.flight_recorder import WORLD_PG, Dump
from ddpdoctor.schema.events import FSDP_STATE_DICT_FILES, Collective, Event, InternalCollectives, InternalPhase

__all__ = ["ConvertedRank", "Pending", "convert_dump", "is_library_file", "user_site", "as_stack", "Interner"]

# Public torch.distributed functions the live probe traces (rank/probes/collectives.py: TRACED).
TRACED = frozenset({
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "reduce", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list",
})
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
_C10D = "torch/distributed/distributed_c10d.py"
_DDP = "torch/nn/parallel/distributed.py"
_AUTOGRAD = ("torch/autograd/", "torch/_tensor.py")
_FSDP = "torch/distributed/fsdp/"
# The profiling names of backends whose op is not the user-facing name.
_OP_NAMES = {"_allgather_base": "all_gather_into_tensor", "_all_gather_base": "all_gather_into_tensor",
             "allgather": "all_gather", "allreduce": "all_reduce", "_reduce_scatter_base": "reduce_scatter_tensor",
             "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "alltoall_base": "all_to_all_single",
             "alltoall": "all_to_all", "allreduce_coalesced": "all_reduce_coalesced",
             "all_reduce_barrier": "barrier"}
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
           "ComplexFloat": "complex64", "ComplexDouble": "complex128"}
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/")
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # ddpdoctor/
_FIXTURES = os.path.join(_PKG_DIR, "fixtures") + os.sep
_TORCH_PARTS = ("/torch/distributed/", "/torch/nn/", "/torch/autograd/", "/torch/_tensor.py", "/torch/utils/",
                "/torch/_dynamo/", "/torch/optim/")


def is_library_file(path: str) -> bool:
    """Whether a frame's file is torch, another installed package, the standard library or
    ddpdoctor itself, judged from the path alone (a dump may come from another machine); the
    bundled fixtures count as the user's code, as the live probes count them."""
    if not path or path.startswith("<"):
        return True
    path = path.replace("\\", "/")
    if path.startswith(_FIXTURES):
        return False
    if path.startswith(_PKG_DIR + os.sep):
        return True
    if "/site-packages/" in path or "/dist-packages/" in path or _STDLIB.search(path):
        return True
    return any(part in path for part in _TORCH_PARTS)


@functools.lru_cache(maxsize=256)
def _rank_branches(filename: str) -> tuple[tuple[int, int], ...]:
    """Line ranges of `if` blocks whose condition mentions a rank (`if rank == 0:`), when the source
    is readable here; the same rule as the live probe's (rank/probes/collectives.py)."""
    try:
        with open(filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple((node.body[0].lineno, node.end_lineno or node.body[-1].lineno) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and "rank" in ast.unparse(node.test).lower())


def in_rank_branch(site: list) -> bool:
    return any(lo <= frame["line"] <= hi for frame in site for lo, hi in _rank_branches(frame["file"]))


class Interner:
    """One shared copy of the sites, tensor lists and ops that many entries and ranks repeat: what
    keeps a thousand ranks' converted dumps within memory."""

    def __init__(self) -> None:
        self._values: dict = {}
        self.library: dict[str, bool] = {}
        self.stacks: dict[tuple, "_Stack"] = {}  # (file, line) of every frame -> what the stack says
        self.described: dict[tuple, tuple] = {}  # (profiling name, sizes, dtypes) -> (op, tensors, [op, tensors])

    def __call__(self, key, make):
        value = self._values.get(key)
        if value is None:
            value = self._values[key] = make()
        return value

    def is_library(self, path: str) -> bool:
        known = self.library.get(path)
        if known is None:
            known = self.library[path] = is_library_file(path)
        return known


def user_site(frames: list, interner: Interner, limit: int = 3) -> list:
    """The script's frames of a stack (innermost first, as the live ``caller_site``)."""
    out = []
    for frame in frames:
        path = frame.get("filename") or ""
        if not interner.is_library(path):
            out.append((path, frame.get("line"), frame.get("name")))
            if len(out) >= limit:
                break
    key = ("site", tuple(out))
    return interner(key, lambda: [{"file": f, "line": int(line or 0), "function": name} for f, line, name in out])


def as_stack(frames: list, interner: Interner) -> list[dict]:
    """A dump's frames as the watchdog's stack format: outermost first, user frames marked."""
    return [{"file": f.get("filename") or "", "line": int(f.get("line") or 0), "function": f.get("name") or "",
             "code": "", "user": not interner.is_library(f.get("filename") or "")} for f in reversed(frames)]


def _op_of(entry: dict) -> str:
    name = (entry.get("profiling_name") or "").split(":", 1)[-1].split(" ", 1)[0]
    return _OP_NAMES.get(name, name)


def _tensors(entry: dict, interner: Interner) -> list:
    sizes = entry.get("input_sizes") or []
    dtypes = entry.get("input_dtypes") or []
    key = ("tensors", repr(sizes), tuple(dtypes))
    return interner(key, lambda: [[list(s), _DTYPES.get(d, str(d).lower())] for s, d in zip(sizes, dtypes)][:8])


def _traced(frames: list) -> Optional[tuple[str, int]]:
    """(op, index of its frame) of the outermost public torch.distributed call in the stack."""
    for index in range(len(frames) - 1, -1, -1):
        frame = frames[index]
        if frame.get("name") in TRACED and (frame.get("filename") or "").replace("\\", "/").endswith(_C10D):
            return frame["name"], index
    return None


def _fsdp_phase(files: list[str]) -> Optional[InternalPhase]:
    """FSDP's phase where FSDP's code made the call (as the live probe names it), else None."""
    if not any(_FSDP in path for path in files):
        return None
    if any(_FSDP in path and path.endswith(FSDP_STATE_DICT_FILES) for path in files):
        return InternalPhase.FSDP_STATE_DICT
    if any(part in path for path in files for part in _AUTOGRAD):
        return InternalPhase.FSDP_BACKWARD
    return InternalPhase.FSDP_FORWARD


def _phase(frames: list) -> InternalPhase:
    """What issued a collective no traced call made, as the live clock names it."""
    files = [(f.get("filename") or "").replace("\\", "/") for f in frames]
    fsdp = _fsdp_phase(files)
    if fsdp is not None:
        return fsdp
    if any(part in path for path in files for part in _AUTOGRAD):
        return InternalPhase.DDP_BACKWARD
    ddp = [f for f, path in zip(frames, files) if path.endswith(_DDP)]
    if any(f.get("name") == "__init__" for f in ddp):
        return InternalPhase.DDP_INIT
    if ddp:
        return InternalPhase.DDP_FORWARD
    if any("torch/distributed/utils.py" in path for path in files):
        return InternalPhase.DDP_INIT
    return InternalPhase.OTHER


@dataclass
class Pending:
    """The collective a rank was still in when it dumped (enqueued, not completed)."""

    op: str
    n: int  # its number on its group
    group: str  # the process group's name ("0": the world)
    frames: list  # innermost first, as the dump holds them
    site: list
    time_s: float
    timeout_s: Optional[float]
    traced: bool


@dataclass
class ConvertedRank:
    """What one dump says about its rank, in evidence terms."""

    rank: int
    events: list[Event] = field(default_factory=list)
    pending: Optional[Pending] = None
    last: Optional[dict] = None  # the last world collective: {"op", "n", "site", "frames", "t", "traced"}
    last_traced: Optional[dict] = None  # the last traced world call: the heartbeat's last_collective
    first_world: Optional[int] = None  # the first world collective number the dump still holds
    cut_off: bool = False  # the ring buffer had wrapped: older entries are gone
    unrecorded_p2p: list = field(default_factory=list)  # [(after collective #n, how many)] (gloo)
    groups: set = field(default_factory=set)  # names of the subgroups this rank used
    backend: str = ""


class _Stack(NamedTuple):
    """What one recorded Python stack says, computed once per distinct stack (they repeat)."""

    traced: Optional[str]  # the public torch.distributed function the script called, if any
    site: list
    phase: InternalPhase  # for a collective no traced call made
    outside: tuple  # the frames outside the traced call: the entries of one call share them
    inside: tuple  # the traced call's own frames: a new call of the same line repeats them
    rank_branch: bool
    fsdp: Optional[str]  # FSDP's phase where FSDP's code made the call (Collective.phase), else None


_NO_STACK = _Stack(None, [], InternalPhase.OTHER, (), (), False, None)
_FRAME_KEY = operator.itemgetter("filename", "line")


def _stack(frames: list, interner: Interner) -> _Stack:
    if not frames:
        return _NO_STACK
    key = tuple(map(_FRAME_KEY, frames))
    info = interner.stacks.get(key)
    if info is None:
        traced = _traced(frames)
        site = user_site(frames, interner)
        index = traced[1] if traced else -1
        phase = _phase(frames)
        info = interner.stacks[key] = _Stack(
            traced=traced[0] if traced else None, site=site, phase=phase,
            outside=key[index + 1:] if traced else (), inside=key[:index + 1] if traced else (),
            rank_branch=in_rank_branch(site), fsdp=phase.value if phase.is_fsdp else None)
    return info


def _describe(entry: dict, interner: Interner) -> tuple[str, list, list]:
    """(op, [[shape], dtype] of its inputs, [op, tensors]) of an entry, shared by every entry alike."""
    op = _op_of(entry)
    tensors = _tensors(entry, interner)
    return op, tensors, interner(("op", op, id(tensors)), lambda: [op, tensors])


def convert_dump(dump: Dump, *, group_ranks: dict[str, list], interner: Interner) -> ConvertedRank:
    """The events of one rank's dump. ``group_ranks``: subgroup name -> the shared list of its global
    ranks, filled by the caller (gloo dumps do not record them; NCCL's pg_config does)."""
    out = ConvertedRank(rank=dump.rank, backend=dump.backend)
    entries = dump.entries
    ids = [e.get("record_id", 0) for e in entries]
    if any(a > b for a, b in zip(ids, ids[1:])):  # torch writes them oldest first; be sure
        entries = sorted(entries, key=lambda e: e.get("record_id", 0))
    out.cut_off = bool(entries) and (entries[0].get("record_id") or 0) > 0
    gaps = out.backend == "gloo"  # gloo numbers its unrecorded send/recv in op_id
    events = out.events
    run: Optional[InternalCollectives] = None
    call: Optional[Collective] = None  # the traced call being grouped (all_gather_object: 2 entries)
    call_stack: Optional[_Stack] = None
    last_op_id: dict[str, int] = {}
    last_n: dict[str, int] = {}
    last: Optional[tuple] = None  # (entry, stack) of the last world collective
    last_traced: Optional[dict] = None
    stacks = interner.stacks
    described: dict[tuple, tuple] = interner.described  # (profiling name, sizes, dtypes) -> (op, tensors, op entry)
    frame_key = _FRAME_KEY
    for entry in entries:  # a thousand ranks of two thousand entries: every lookup here counts
        process_group = entry.get("process_group")
        group = str(process_group[0]) if process_group else WORLD_PG
        frames = entry.get("frames") or ()
        info = stacks.get(tuple(map(frame_key, frames))) if frames else _NO_STACK
        if info is None:
            info = _stack(frames, interner)
        t = (entry.get("time_created_ns") or 0) / 1e9
        n = int(entry.get("collective_seq_id") or 0)
        p2p = bool(entry.get("is_p2p"))
        if gaps:
            op_id = entry.get("op_id")
            if isinstance(op_id, int):
                if not p2p and group in last_op_id and op_id - last_op_id[group] > n - last_n.get(group, n):
                    out.unrecorded_p2p.append((last_n[group], op_id - last_op_id[group] - (n - last_n[group])))
                last_op_id[group] = op_id
        sizes, dtypes = entry.get("input_sizes") or (), entry.get("input_dtypes") or ()
        what = (entry.get("profiling_name") or "", repr(sizes), tuple(dtypes))
        description = described.get(what)
        if description is None:
            description = described[what] = _describe(entry, interner)
        op = info.traced or description[0]
        tensors = description[1]
        if out.pending is None and not (entry.get("retired") or entry.get("state") == "completed"):
            timeout = entry.get("timeout_ms")
            out.pending = Pending(op=op, n=n, group=group, frames=frames, site=info.site, time_s=t,
                                  timeout_s=timeout / 1000 if timeout else None, traced=info.traced is not None)
        if p2p:
            events.append(Collective(t=t, op=op, n=last_n.get(group, 0) + 1, tensors=tensors,
                                     group=None if group == WORLD_PG else group_ranks.setdefault(group, []),
                                     site=info.site, units=0, seq=last_n.get(WORLD_PG, 0)))
            run = call = None
            continue
        last_n[group] = n
        if group != WORLD_PG:
            out.groups.add(group)
            events.append(Collective(t=t, op=op, n=n, tensors=tensors, group=group_ranks.setdefault(group, []),
                                     site=info.site, units=1, pg_seq=n, seq=last_n.get(WORLD_PG, 0),
                                     rank_branch=info.rank_branch, phase=info.fsdp))
            run = call = None
            continue
        if out.first_world is None:
            out.first_world = n
        last = (entry, info, n, t, op)
        if info.traced is None and frames:
            if run is not None and run.phase == info.phase and run.site is info.site and run.first + run.count == n:
                run.count += 1
                run.ops.append(description[2])
            else:
                run = InternalCollectives(t=t, first=n, count=1, phase=info.phase, site=info.site,
                                          ops=[description[2]], seq=n - 1)
                events.append(run)
            call = None
            continue
        run = None
        if call is not None and call.op == op and call_stack is not None and call_stack.inside != info.inside \
                and call_stack.outside == info.outside and call.n + call.units == n:
            call.units += 1  # the same call's next collective (all_gather_object: sizes, then data)
            continue
        call = Collective(t=t, op=op, n=n, tensors=tensors, site=info.site, units=1, pg_seq=n, seq=n - 1,
                          rank_branch=info.rank_branch, phase=info.fsdp)
        call_stack = info
        events.append(call)
        last_traced = {"op": op, "n": n, "site": info.site[0] if info.site else None}
    if last is not None:
        entry, info, n, t, op = last
        out.last = {"op": op, "n": n, "site": info.site[0] if info.site else None, "frames": entry.get("frames") or [],
                    "t": t, "traced": info.traced is not None}
    out.last_traced = last_traced
    return out
