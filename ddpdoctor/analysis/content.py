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

Chance so measured assumes that a rank's draws spread over the whole corpus. Ranks that each shuffle
one pool with their own seed and read it without replacement (llama2.c's PretokDataset, seeded with
the rank) never repeat a row of their own, yet share about the fraction of the pool each has read.
What tells that from ranks reading one stream is the order: rows two ranks share come in the same
order when they read the same stream, in unrelated orders when each draws its own sample
(:func:`shared_order`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ddpdoctor.schema.events import ContentPass
from ddpdoctor.schema.indices import decode_indices

__all__ = ["MIN_ROWS", "MIN_SHARED", "MIN_FRACTION", "CHANCE_FACTOR", "CHANCE_MARGIN", "MIN_ORDERED", "StreamKey",
           "Stream", "Overlap", "Order", "merge_streams", "overlap", "shared_order", "read_whole_pool", "pool_size",
           "looks_like_padding", "repeated_orders", "feed_label", "first"]

MIN_ROWS = 32  # distinct rows two ranks need in a pass before it is judged
MIN_SHARED = 8
MIN_FRACTION = 0.05
CHANCE_FACTOR = 4.0
CHANCE_MARGIN = 0.02
MIN_ORDERED = 8  # shared rows whose feeding order two ranks recorded, before that order is judged
ALIGNED_CORRELATION = 0.5  # rank correlation of the shared rows' positions that means "the same order"
ALIGNED_SIGMAS = 2.5  # ... and how far above what unrelated orders give (1 / sqrt(n - 1) per sigma)
WHOLE_POOL = 0.9  # a complete pass in which every rank fed at least this share of what others fed

StreamKey = tuple[str, str, Optional[str], int]  # (source, key, feeds, number)


@dataclass(frozen=True)
class Stream:
    """One rank's whole pass: the last part's counters and every part's kept hashes."""

    event: ContentPass
    hashes: tuple[int, ...]
    sequence: tuple[int, ...] = ()  # the first kept hashes in feeding order (ContentPass.sequence)

    @property
    def level(self) -> int:
        return self.event.level


def merge_streams(events: Iterable[tuple[int, ContentPass]]) -> dict[StreamKey, dict[int, Stream]]:
    """(source, key, feeds, number) -> rank -> the pass with its parts merged."""
    parts: dict[tuple[str, str, Optional[str], int, int], list[ContentPass]] = {}
    for rank, event in events:
        parts.setdefault((event.source, event.key, event.feeds, event.number, rank), []).append(event)
    out: dict[StreamKey, dict[int, Stream]] = {}
    for (source, key, feeds, number, rank), pieces in parts.items():
        pieces.sort(key=lambda p: p.part)
        hashes = tuple(h for p in pieces if p.hashes for h in decode_indices(p.hashes))
        sequence = tuple(h for p in pieces for h in p.sequence)
        last = dataclasses.replace(pieces[-1], head=pieces[0].head) if len(pieces) > 1 else pieces[-1]
        out.setdefault((source, key, feeds, number), {})[rank] = Stream(last, hashes, sequence)
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
    per_rank: dict[int, float]  # rank -> its fraction
    duplicate_rate: dict[int, float]  # rank -> fraction of its rows that repeat one of its own
    rows: dict[int, int]  # rank -> rows compared (after sampling)
    level: int  # sampling level all ranks were brought to
    shared: frozenset[int]
    judged: bool  # enough rows on at least two ranks

    @property
    def significant(self) -> bool:
        return (self.judged and self.num_shared >= MIN_SHARED and self.fraction >= MIN_FRACTION
                and self.fraction >= CHANCE_FACTOR * self.expected + CHANCE_MARGIN)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, f in self.per_rank.items() if f > 0))

    def as_evidence(self) -> dict[str, Any]:
        return {"overlap_fraction": round(self.fraction, 4), "expected_fraction": round(self.expected, 4),
                "num_shared": self.num_shared,
                "overlap_per_rank": {str(r): round(f, 4) for r, f in self.per_rank.items()},
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


@dataclass(frozen=True)
class Order:
    """How the rows two ranks share were ordered on each: Spearman's rank correlation of their
    feeding positions (1: the same order; about 0: unrelated orders), over the pair of ranks that
    agree most."""

    correlation: float
    num_rows: int  # shared rows compared, on that pair
    ranks: tuple[int, int]

    @property
    def aligned(self) -> bool:
        """The same order, beyond what unrelated orders give by chance."""
        return (self.correlation >= ALIGNED_CORRELATION
                and self.correlation * math.sqrt(self.num_rows - 1) >= ALIGNED_SIGMAS)

    def as_evidence(self) -> dict[str, Any]:
        return {"shared_order_correlation": round(self.correlation, 4), "shared_rows_ordered": self.num_rows,
                "order_ranks": list(self.ranks)}


def _positions(sequence: Iterable[int], level: int) -> dict[int, int]:
    """Row hash -> its first feeding position, among the rows kept at ``level``."""
    positions: dict[int, int] = {}
    for h in _at_level(sequence, level):
        positions.setdefault(h, len(positions))
    return positions


def _rank_correlation(pairs: list[tuple[int, int]]) -> float:
    """Spearman's rho of distinct position pairs."""
    n = len(pairs)
    by_first = sorted(range(n), key=lambda i: pairs[i][0])
    by_second = sorted(range(n), key=lambda i: pairs[i][1])
    rank_first, rank_second = [0] * n, [0] * n
    for r, i in enumerate(by_first):
        rank_first[i] = r
    for r, i in enumerate(by_second):
        rank_second[i] = r
    d2 = sum((a - b) ** 2 for a, b in zip(rank_first, rank_second))
    return 1 - 6 * d2 / (n * (n * n - 1))


def shared_order(streams: dict[int, Stream], level: int) -> Optional[Order]:
    """The order of the rows each rank shares with the next (ranks in a ring, so it stays linear in
    the ranks), at sampling ``level``; the most aligned pair judged. None: no pair recorded
    ``MIN_ORDERED`` shared rows in order (old evidence, or shared rows fed after the recorded ones)."""
    ranks = sorted(r for r, s in streams.items() if s.sequence)
    positions = {r: _positions(streams[r].sequence, level) for r in ranks}
    best: Optional[Order] = None
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        if a == b:
            continue
        pairs = [(p, positions[b][h]) for h, p in positions[a].items() if h in positions[b]]
        if len(pairs) < MIN_ORDERED:
            continue
        found = Order(correlation=_rank_correlation(pairs), num_rows=len(pairs), ranks=(a, b))
        if best is None or found.correlation > best.correlation:
            best = found
    return best


def read_whole_pool(streams: dict[int, Stream], result: "Overlap") -> bool:
    """Every rank read to the end of its stream and fed (nearly) everything the others fed: the
    ranks each read the whole data, whatever their orders; random draws leave most rows to one rank."""
    return (all(s.event.complete for s in streams.values())
            and min(result.per_rank.values(), default=0.0) >= WHOLE_POOL)


def pool_size(streams: dict[int, Stream], result: "Overlap") -> Optional[int]:
    """How many distinct rows a pool must hold for independent random draws of the ranks' sizes to
    share as many as they did (Lincoln-Petersen, on the two lowest ranks, scaled back from the
    sampling level); None when they shared none."""
    ranks = sorted(streams)[:2]
    if len(ranks) < 2:
        return None
    first, second = (set(_at_level(streams[r].hashes, result.level)) for r in ranks)
    shared = len(first & second)
    return round(len(first) * len(second) / shared * 2 ** result.level) if shared else None


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
