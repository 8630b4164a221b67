"""Converted dumps across processes: ``ddpdoctor analyze`` converts a thousand dumps in a pool of
worker processes, and their events travel back as plain tuples (fast to pickle), each distinct
site, tensor list and op list once in tables the tuples index, as :class:`Interner` shares them."""

from __future__ import annotations

import functools

from ddpdoctor.postmortem.dump_events import ConvertedRank, Interner
from ddpdoctor.schema.events import Collective, Event, InternalCollectives

__all__ = ["Packer", "Unpacker"]


class Packer:
    """Packs converted ranks for another process: events as tuples of numbers, each distinct site,
    tensor list and op list once in tables the tuples index (what :class:`Interner` made shared)."""

    def __init__(self) -> None:
        self.tables: tuple[list, list, list] = ([], [], [])  # sites, tensor lists, ops lists
        self._index: tuple[dict, dict] = ({}, {})  # id(a site or tensor list the Interner keeps alive) -> index
        self._ops: dict[tuple, int] = {}

    def _ref(self, kind: int, value, key) -> int:
        index = self._index[kind].get(id(value))
        if index is None:
            index = self._index[kind][id(value)] = len(self.tables[kind])
            self.tables[kind].append(key(value))
        return index

    def pack(self, converted: ConvertedRank, group_ranks: dict[str, list]) -> tuple:
        names = {id(ranks): name for name, ranks in group_ranks.items()}
        site = functools.partial(self._ref, 0, key=lambda v: tuple((f["file"], f["line"], f["function"]) for f in v))
        tensors = functools.partial(self._ref, 1, key=lambda v: tuple((tuple(s), d) for s, d in v))
        rows = []
        for e in converted.events:
            if isinstance(e, Collective):
                rows.append((0, e.t, e.op, e.n, tensors(e.tensors), site(e.site),
                             None if e.group is None else names[id(e.group)], e.units, e.pg_seq, e.seq, e.rank_branch))
            else:  # a run's own list of ops: indexed by what it holds (its id may be reused once it is gone)
                content = tuple((op, tensors(t)) for op, t in e.ops)
                index = self._ops.get(content)
                if index is None:
                    index = self._ops[content] = len(self.tables[2])
                    self.tables[2].append(content)
                rows.append((1, e.t, e.first, e.count, e.phase, site(e.site), index, e.seq))
        return rows, dict(converted.__dict__, events=None)


class Unpacker:
    """Rebuilds what a :class:`Packer` sent, sharing sites and tensor lists with this process's ranks."""

    def __init__(self, tables: tuple[list, list, list], interner: Interner) -> None:
        sites, tensor_lists, ops = tables
        self.sites = [interner(("site", k), lambda k=k: [{"file": f, "line": line, "function": fn}
                                                       for f, line, fn in k]) for k in sites]
        self.tensors = [interner(("packed-tensors", k), lambda k=k: [[list(s), d] for s, d in k])
                        for k in tensor_lists]
        self.ops = [[interner(("packed-op", op, t), lambda op=op, t=t: [op, self.tensors[t]]) for op, t in k]
                    for k in ops]

    def unpack(self, packed: tuple, *, group_ranks: dict[str, list]) -> ConvertedRank:
        rows, state = packed
        converted = ConvertedRank(**state)
        events: list[Event] = []
        converted.events = events
        sites, tensors = self.sites, self.tensors
        for row in rows:
            if row[0] == 0:
                _, t, op, n, tensor_ref, site_ref, group, units, pg_seq, seq, rank_branch = row
                events.append(Collective(t=t, op=op, n=n, tensors=tensors[tensor_ref], site=sites[site_ref],
                                         group=None if group is None else group_ranks.setdefault(group, []),
                                         units=units, pg_seq=pg_seq, seq=seq, rank_branch=rank_branch))
            else:
                _, t, first, count, phase, site_ref, ops_ref, seq = row
                events.append(InternalCollectives(t=t, first=first, count=count, phase=phase, site=sites[site_ref],
                                                  seq=seq, ops=list(self.ops[ops_ref])))
        return converted
