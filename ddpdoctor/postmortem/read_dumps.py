"""Every dump read and converted to its rank's events (:mod:`dump_events`), one by one here or, for
many dumps, in chunks in the caller's pool of processes (their events packed for the way back:
:mod:`packing`), with the members of each process group gathered across the dumps."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional

from ddpdoctor.analysis.evidence import no_cyclic_gc
from ddpdoctor.postmortem.dump_events import Interner, convert_dump
from ddpdoctor.postmortem.flight_recorder import WORLD_PG, Dump, NotADump, rank_from_name, read_dump
from ddpdoctor.postmortem.packing import Packer, Unpacker

__all__ = ["MapChunks", "CHUNK", "PARALLEL_FROM", "convert_chunk", "converted_dumps"]

MapChunks = Callable[[Callable[[list], tuple], list], Iterable[tuple]]  # map(function, chunks), maybe in processes
CHUNK = 16  # dumps per task when converting in several processes
PARALLEL_FROM = 64  # fewer dumps convert faster here than a pool of processes starts


def convert_chunk(paths: list[str]) -> tuple:
    """Read and convert some dumps, for another process: (the packer's tables, one result per path),
    the events packed (:class:`Packer`)."""
    group_ranks: dict[str, list] = {}
    interner = Interner()
    packer = Packer()
    with no_cyclic_gc():
        out = []
        for path in paths:
            result = _convert_path(path, group_ranks, interner)
            out.append(result if result[0] == "bad" else (*result[:5], packer.pack(result[5], group_ranks)))
        return packer.tables, out


def _convert_path(path: str, group_ranks: dict[str, list], interner: Interner) -> tuple:
    """("ok", rank, (path, mtime, format, version), world size per pg_config, {group: ranks}, converted)
    or ("bad", path, why, the rank its name says)."""
    try:
        dump = read_dump(path)
    except NotADump as exc:
        return ("bad", path, str(exc).split(": ", 1)[-1], rank_from_name(path))
    groups: dict[str, list] = {}
    _record_group_ranks(dump, groups)
    _merge_groups(group_ranks, groups)
    converted = convert_dump(dump, group_ranks=group_ranks, interner=interner)
    return ("ok", dump.rank, (path, dump.mtime, dump.format, dump.version), _world_from_config(dump), groups,
            converted)


def _merge_groups(group_ranks: dict[str, list], found: dict[str, list]) -> None:
    for name, ranks in found.items():
        shared = group_ranks.setdefault(name, [])
        if ranks and not shared:
            shared.extend(ranks)


def converted_dumps(paths: list[str], group_ranks: dict[str, list], interner: Interner,
                     map_chunks: Optional[MapChunks]) -> Iterator[tuple]:
    if map_chunks is None or len(paths) < PARALLEL_FROM:
        for path in paths:
            yield _convert_path(path, group_ranks, interner)
        return
    for tables, results in map_chunks(convert_chunk, [paths[i:i + CHUNK] for i in range(0, len(paths), CHUNK)]):
        unpacker = Unpacker(tables, interner)
        for result in results:
            if result[0] == "ok":
                _merge_groups(group_ranks, result[4])
                result = (*result[:5], unpacker.unpack(result[5], group_ranks=group_ranks))
            yield result


def _world_from_config(dump: Dump) -> int:
    """The world size where the dump recorded the default group's members (NCCL does)."""
    for name, config in dump.pg_config.items():
        if str(name) == WORLD_PG or (isinstance(config, dict) and config.get("desc") == "default_pg"):
            return len(_ranks_list(config.get("ranks")))
    return 0


def _record_group_ranks(dump: Dump, group_ranks: dict[str, list]) -> None:
    for name, config in dump.pg_config.items():
        if str(name) in ("", WORLD_PG) or not isinstance(config, dict):
            continue
        ranks = _ranks_list(config.get("ranks"))
        shared = group_ranks.setdefault(str(name), [])
        if ranks and not shared:
            shared.extend(ranks)


def _ranks_list(value) -> list[int]:
    if isinstance(value, str):
        value = value.strip("[] ").split(",") if value.strip("[] ") else []
    try:
        return [int(v) for v in value or []]
    except (TypeError, ValueError):
        return []
