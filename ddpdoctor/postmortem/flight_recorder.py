"""PyTorch's flight recorder dumps: reading them, whatever wrote them.

A dump is what ``torch._C._distributed_c10d._dump_fr_trace`` returns (a pickle; NCCL's dump on
timeout writes the same bytes to ``TORCH_FR_DUMP_TEMP_FILE`` + rank) or its JSON twin
``_dump_fr_trace_json`` (no Python stacks). Neither holds the rank that wrote it: torch names the
file ``<prefix><rank>``, and so does this reader. Pickles are read with no class lookups at all, so
a file that is not a dump can never run code here.

What a dump says, as torch 2.13 writes it (checked on gloo and in torch's NCCL sources):
``entries`` in a ring buffer of ``TORCH_FR_BUFFER_SIZE`` (default 2000; ``record_id`` counts every
entry ever recorded, so a first ``record_id`` above 0 means older entries were overwritten),
``collective_seq_id`` numbering a process group's collectives (point-to-point excluded; gloo does
not record send/recv at all, but numbers them in ``op_id``), ``frames`` the Python stack at enqueue
(innermost first), ``retired``/``state`` whether the collective completed.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Dump", "NotADump", "read_dump", "rank_from_name", "looks_like_dump", "WORLD_PG"]

WORLD_PG = "0"  # the default process group's name in every dump
_RANK_SUFFIX = re.compile(r"(\d+)$")
_EXTENSIONS = (".pkl", ".pickle", ".json", ".bin", ".pt")


class NotADump(ValueError):
    """The file is not a flight recorder dump."""


class _NoGlobals(pickle.Unpickler):
    """A dump holds dicts, lists, tuples, strings and numbers only: refuse everything else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module}.{name}")


@dataclass
class Dump:
    """One rank's dump. ``entries`` are torch's own dicts, normalized to the pickle's field types."""

    path: str
    rank: int
    format: str  # "pickle" | "json"
    version: str = ""
    pg_config: dict = field(default_factory=dict)
    pg_status: dict = field(default_factory=dict)
    entries: list = field(default_factory=list)
    mtime: float = 0.0  # when the file was written: the dump's own time (dumps carry none)

    @property
    def has_frames(self) -> bool:
        return any(e.get("frames") for e in self.entries)

    @property
    def first_record(self) -> Optional[int]:
        return self.entries[0].get("record_id") if self.entries else None

    @property
    def backend(self) -> str:
        """"gloo", "nccl"... from the entries' profiling names ("gloo:all_reduce")."""
        for entry in self.entries:
            name = entry.get("profiling_name") or ""
            if ":" in name:
                return name.split(":", 1)[0]
        return ""


def rank_from_name(path: str) -> Optional[int]:
    """torch's ``<prefix><rank>`` naming, tolerating an extension added by hand (``trace_3.pkl``)."""
    name = os.path.basename(path)
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    match = _RANK_SUFFIX.search(name)
    return int(match.group(1)) if match else None


def looks_like_dump(head: bytes) -> bool:
    """A cheap sniff of a file's first bytes: a pickle, or JSON that mentions entries."""
    stripped = head.lstrip()
    return head[:1] == b"\x80" or (stripped[:1] == b"{" and (b'"entries"' in head or b'"pg_config"' in head))


def read_dump(path: str, *, rank: Optional[int] = None) -> Dump:
    """The dump at ``path``; its rank from the file name unless given. NotADump if it is none."""
    rank = rank_from_name(path) if rank is None else rank
    if rank is None:
        raise NotADump(f"{path}: no rank at the end of the file name (torch names dumps <prefix><rank>)")
    with open(path, "rb") as f:  # a buffered file: the unpickler reads it in large chunks, not per opcode
        if f.peek(1)[:1] == b"\x80":
            try:
                loaded = _NoGlobals(f).load()
            except Exception as exc:  # truncated file, another pickle: say which
                raise NotADump(f"{path}: not a readable flight recorder pickle ({type(exc).__name__}: {exc})") from None
            fmt = "pickle"
        else:
            try:
                loaded = json.loads(f.read())
            except (UnicodeDecodeError, ValueError):
                raise NotADump(f"{path}: neither a pickle nor JSON") from None
            fmt = "json"
    if not isinstance(loaded, dict) or "entries" not in loaded or not isinstance(loaded["entries"], list):
        raise NotADump(f"{path}: no flight recorder entries in it")
    entries = loaded["entries"]
    if fmt == "json":
        entries = [_normalize_json_entry(e) for e in entries if isinstance(e, dict)]
    return Dump(path=path, rank=rank, format=fmt, version=str(loaded.get("version") or ""),
                pg_config=loaded.get("pg_config") or {}, pg_status=_normalize_status(loaded.get("pg_status") or {}),
                entries=entries, mtime=os.path.getmtime(path))


def _normalize_status(status: dict) -> dict:
    """The JSON variant writes the numbers as strings."""
    out = {}
    for pg, values in status.items():
        if isinstance(values, dict):
            out[str(pg)] = {k: _int(v) for k, v in values.items()}
    return out


def _normalize_json_entry(entry: dict) -> dict:
    entry = dict(entry)
    group = entry.get("process_group")
    if isinstance(group, list):
        entry["process_group"] = tuple(group)
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        if entry.get(key) == 0:
            entry[key] = None
    return entry


def _int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value
