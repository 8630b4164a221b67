"""Statistics of sample fingerprints across ranks: pure functions of ContentPass events.

Overlap is judged per pass (a DataLoader epoch, or a window of DDP forwards): the fraction of each
rank's distinct rows that some other rank also fed, against two baselines that make legitimate
repeats clean:

- chance: ranks that draw at random with replacement from one corpus (random windows of a token
  array) share rows only as often as each rank repeats its own rows;
- duplicates in the data: a dataset that holds copies of a sample splits them across ranks as
  often as it leaves both on one rank, so again cross-rank sharing tracks each rank's own repeats.

Both predict the same thing. With C collisions among P pairs of rows drawn on the same rank, the
corpus behaves like M = P / C distinct samples, and a row of rank r is found among the N rows of
the other ranks with probability 1 - exp(-N / M). C is taken at an upper bound (C + 2 sqrt(C) + 1)
so that a pass with few rows does not make chance look smaller than it is. A pass is flagged when
the observed fraction is both large (``MIN_FRACTION``, ``MIN_SHARED`` rows) and well above chance
(``CHANCE_FACTOR`` times it plus ``CHANCE_MARGIN``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional

from ddpdoctor.schema.events import ContentPass
from ddpdoctor.schema.indices import decode_indices

__all__ = ["MIN_ROWS", "MIN_SHARED", "MIN_FRACTION", "CHANCE_FACTOR", "CHANCE_MARGIN", "StreamKey", "Stream",
           "Overlap", "merge_streams", "overlap", "looks_like_padding", "repeated_orders", "feed_label", "first"]

MIN_ROWS = 32  # distinct rows two ranks need in a pass before it is judged
MIN_SHARED = 8
MIN_FRACTION = 0.05
CHANCE_FACTOR = 4.0
CHANCE_MARGIN = 0.02

StreamKey = tuple  # (source, key, feeds, number)


@dataclass(frozen=True)
class Stream:
    """One rank's whole pass: the last part's counters and every part's kept hashes."""

    event: ContentPass
    hashes: tuple[int, ...]

    @property
    def level(self) -> int:
        return self.event.level


def merge_streams(events: Iterable[tuple[int, ContentPass]]) -> dict[StreamKey, dict[int, Stream]]:
    """(source, key, feeds, number) -> rank -> the pass with its parts merged."""
    parts: dict[tuple, list[ContentPass]] = {}
    for rank, event in events:
        parts.setdefault((event.source, event.key, event.feeds, event.number, rank), []).append(event)
    out: dict[StreamKey, dict[int, Stream]] = {}
    for (*key, rank), pieces in parts.items():
        pieces.sort(key=lambda p: p.part)
        hashes = tuple(h for p in pieces if p.hashes for h in decode_indices(p.hashes))
        last = dataclasses.replace(pieces[-1], head=pieces[0].head) if len(pieces) > 1 else pieces[-1]
        out.setdefault(tuple(key), {})[rank] = Stream(last, hashes)
    return out


def _at_level(hashes: Iterable[int], level: int) -> list[int]:
    shift = 63 - level
    return [h for h in hashes if h >> shift == 0]


@dataclass(frozen=True)
class Overlap:
    """How much of what each rank fed in one pass other ranks fed too."""

    fraction: float  # pooled: rows (distinct per rank) also seen on another rank / distinct rows
    expected: float  # the same fraction by chance, from the ranks' own repeats
    num_shared: int  # distinct rows seen on more than one rank
    per_rank: dict  # rank -> its fraction
    duplicate_rate: dict  # rank -> fraction of its rows that repeat one of its own
    rows: dict  # rank -> rows compared (after sampling)
    level: int  # sampling level all ranks were brought to
    shared: frozenset
    judged: bool  # enough rows on at least two ranks

    @property
    def significant(self) -> bool:
        return (self.judged and self.num_shared >= MIN_SHARED and self.fraction >= MIN_FRACTION
                and self.fraction >= CHANCE_FACTOR * self.expected + CHANCE_MARGIN)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, f in self.per_rank.items() if f > 0))

    def as_evidence(self) -> dict:
        return {"overlap_fraction": round(self.fraction, 4), "expected_fraction": round(self.expected, 4),
                "num_shared": self.num_shared, "overlap_per_rank": {str(r): round(f, 4) for r, f in self.per_rank.items()},
                "duplicate_rate": {str(r): round(d, 4) for r, d in self.duplicate_rate.items()},
                "rows_compared": {str(r): n for r, n in self.rows.items()}, "sampling_level": self.level}


def overlap(streams: dict[int, Stream]) -> Overlap:
    """Cross-rank overlap of one pass, all ranks brought to the coarsest sampling level."""
    level = max((s.level for s in streams.values()), default=0)
    rows = {r: _at_level(s.hashes, level) for r, s in sorted(streams.items())}
    distinct = {r: set(h) for r, h in rows.items()}
    holders = Counter(h for d in distinct.values() for h in d)
    shared = frozenset(h for h, c in holders.items() if c > 1)
    per_rank = {r: (len(d & shared) / len(d) if d else 0.0) for r, d in distinct.items()}
    total_distinct = sum(len(d) for d in distinct.values())
    fraction = sum(len(d & shared) for d in distinct.values()) / total_distinct if total_distinct else 0.0
    pairs = sum(len(h) * (len(h) - 1) / 2 for h in rows.values())
    collisions = sum(len(h) - len(distinct[r]) for r, h in rows.items())
    collisions_bound = collisions + 2 * math.sqrt(collisions) + 1
    corpus = pairs / collisions_bound if pairs else math.inf
    total_rows = sum(len(h) for h in rows.values())
    expected = 0.0
    if total_distinct and corpus > 0:
        expected = sum(len(distinct[r]) * (1 - math.exp(-(total_rows - len(h)) / corpus))
                       for r, h in rows.items()) / total_distinct
    return Overlap(fraction=fraction, expected=expected, num_shared=len(shared), per_rank=per_rank,
                   duplicate_rate={r: (1 - len(distinct[r]) / len(h) if h else 0.0) for r, h in rows.items()},
                   rows={r: len(h) for r, h in rows.items()}, level=level, shared=shared,
                   judged=sum(len(d) >= MIN_ROWS for d in distinct.values()) >= 2)


def looks_like_padding(streams: dict[int, Stream], result: Overlap) -> bool:
    """Shared rows that only even out the last batches by wrapping around to the first samples
    (DistributedSampler's padding, Accelerate's even_batches): few, each in some rank's last
    batches and in some rank's first ones, in passes that reached their end (in a pass cut short
    after its first batch, that batch is both first and last)."""
    if not result.shared or not all(s.event.complete for s in streams.values()):
        return False
    batch = max(s.event.batch_rows for s in streams.values()) or 1
    if result.num_shared > len(streams) * batch:
        return False
    firsts = {h for s in streams.values() for h in s.event.head}
    lasts = {h for s in streams.values() for h in s.event.tail[-batch:]}
    return all(h in firsts and h in lasts for h in result.shared)


def repeated_orders(passes: list[Stream]) -> list[tuple[int, int]]:
    """(pass number, the previous pass number) for each complete pass of one rank over one loader
    that fed exactly the same rows in exactly the same order as the complete pass before it."""
    done = sorted((s for s in passes if s.event.complete and s.event.num_rows >= MIN_ROWS),
                  key=lambda s: s.event.number)
    return [(b.event.number, a.event.number) for a, b in zip(done, done[1:])
            if a.event.order == b.event.order and a.event.num_rows == b.event.num_rows]


def feed_label(key: str, number: int) -> str:
    """How a forward window names the loader pass that fed it."""
    return f"{key}#{number}"


def first(streams: dict[int, Stream]) -> Optional[ContentPass]:
    return streams[min(streams)].event if streams else None
