"""The collective benchmark in a terminal: one table per run, a bar of bus bandwidth per row.

Bars are text (█ and the eighth blocks), scaled to the highest bus bandwidth in the table, so the
same table reads in a coloured terminal, a CI log and a copied-and-pasted issue.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis.render.words import format_bytes

__all__ = ["bar", "benchmark_table", "render_benchmark"]

_EIGHTHS = " ▏▎▍▌▋▊▉"
_PLAIN_BAR = "#"


def bar(value: float, peak: float, *, width: int = 24, plain: bool = False) -> str:
    """A horizontal bar ``value / peak`` of ``width`` characters (eighth blocks unless plain)."""
    if peak <= 0 or value <= 0:
        return ""
    cells = max(0.0, min(1.0, value / peak)) * width
    if plain:
        return _PLAIN_BAR * max(1, round(cells))
    full, eighths = int(cells), int((cells - int(cells)) * 8)
    text = "█" * full + (_EIGHTHS[eighths] if eighths else "")
    return text or "▏"


def _time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 10_000 else f"{us:.1f} us"


def benchmark_table(benchmark: Mapping[str, Any], *, plain: bool = False, bar_width: int = 24) -> Table:
    """op, size, time, algbw, busbw, a busbw bar and the slowest rank (host): one row per measurement."""
    rows = benchmark.get("rows", [])
    peak = max((r["busbw_gbps"] for r in rows), default=0.0)
    title = (f"collective benchmark: {benchmark.get('backend')} on {benchmark.get('device')}, "
             f"{benchmark.get('world_size')} ranks (GB/s = 1e9 B/s; busbw as nccl-tests)")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", title=title, title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("op", "left"), ("size", "right"), ("time", "right"), ("algbw GB/s", "right"), ("busbw GB/s", "right"),
        ("busbw", "left"), ("slowest", "left"))
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=True)
    previous_op = None
    for row in rows:
        host = f" ({row['slowest_host']})" if row.get("slowest_host") else ""
        table.add_row(row["op"] if row["op"] != previous_op else "", format_bytes(row["bytes"]),
                      _time(row["time_us"]), f"{row['algbw_gbps']:.3f}", f"{row['busbw_gbps']:.3f}",
                      Text(bar(row["busbw_gbps"], peak, width=bar_width, plain=plain),
                           style="" if plain else "cyan"),
                      f"rank {row['slowest_rank']}{host}")
        previous_op = row["op"]
    return table


def render_benchmark(console: Console, benchmark: Mapping[str, Any], *, plain: bool) -> None:
    console.print(benchmark_table(benchmark, plain=plain))
    for skipped in benchmark.get("skipped", []):
        console.print(Text(f"{skipped['op']} skipped: {skipped['reason']}", style="dim"))
