"""Bus bandwidth as nccl-tests defines it, the report's collective_benchmark field, the
collective-bandwidth check, and the table with its bars."""

from __future__ import annotations

import io

import pytest
from builders import make_evidence
from rich.console import Console

from ddpdoctor.analysis.bandwidth import bandwidths, bus_factor, collective_benchmark
from ddpdoctor.analysis.render.benchmark import bar, benchmark_table
from ddpdoctor.analysis.render.words import format_bytes
from ddpdoctor.checks import collective_bandwidth
from ddpdoctor.schema import events as ev


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        bus_factor("all_to_all_v", 2)


def test_algbw_is_bytes_over_time_and_busbw_scales_it():
    algbw, busbw = bandwidths("all_reduce", 2**30, 10_000.0, 8)  # 1 GiB in 10 ms
    assert algbw == pytest.approx(2**30 / 0.01 / 1e9)
    assert busbw == pytest.approx(algbw * 1.75)
    assert bandwidths("all_gather", 1024, 0.0, 4) == (0.0, 0.0)


def bench(rows: list[tuple[str, int, float]], **fields) -> ev.CollectiveBenchmark:
    return ev.CollectiveBenchmark(backend="nccl", device="cuda", world_size=2,
                                  rows=[{"op": op, "bytes": b, "time_us": t} for op, b, t in rows], **fields)


def evidence_with(min_busbw=None):
    per_rank = {0: [bench([("all_reduce", 1 << 20, 100.0), ("all_gather", 1 << 20, 50.0)])],
                1: [bench([("all_reduce", 1 << 20, 300.0), ("all_gather", 1 << 20, 50.0)])]}
    evidence = make_evidence(2, per_rank, min_busbw_gbps=min_busbw)
    evidence.ranks[1].host = "node7"
    return evidence


def test_report_field_takes_the_mean_over_ranks_and_names_the_slowest():
    field = collective_benchmark(evidence_with())
    assert (field["backend"], field["device"], field["world_size"]) == ("nccl", "cuda", 2)
    reduce_row = next(r for r in field["rows"] if r["op"] == "all_reduce")
    assert reduce_row["time_us"] == 200.0 and reduce_row["slowest_rank"] == 1 and reduce_row["slowest_host"] == "node7"
    assert reduce_row["algbw_gbps"] == pytest.approx((1 << 20) / 200e-6 / 1e9, rel=1e-3)
    assert reduce_row["busbw_gbps"] == pytest.approx(reduce_row["algbw_gbps"] * 1.0, rel=1e-3)
    assert set(reduce_row) >= {"op", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "slowest_rank"}
    assert collective_benchmark(make_evidence(2, {0: [], 1: []})) is None


def test_the_check_skips_passes_and_fails_below_the_floor():
    assert collective_bandwidth.analyze(make_evidence(2, {0: [], 1: []})).status == "skip"
    passed = collective_bandwidth.analyze(evidence_with())
    assert passed.status == "pass" and "peak busbw all_reduce" in passed.summary
    assert collective_bandwidth.analyze(evidence_with(min_busbw=1.0)).status == "pass"
    failed = collective_bandwidth.analyze(evidence_with(min_busbw=100.0))
    (finding,) = failed.findings
    assert finding.severity == "error" and set(finding.evidence["peaks"]) == {"all_reduce", "all_gather"}
    assert "below --min-busbw 100" in finding.message and "node7" in finding.message


def test_bars_and_sizes():
    assert format_bytes(8) == "8 B" and format_bytes(4096) == "4 KiB" and format_bytes(2**30) == "1 GiB"
    assert format_bytes(3 * 2**19) == "1.5 MiB"
    assert bar(10, 10, width=8) == "█" * 8
    assert bar(5, 10, width=8, plain=True) == "####"
    assert bar(1, 10, width=8) == "▊"  # 0.8 of a cell: an eighth block
    assert bar(0, 10) == "" and bar(1, 0) == ""


def test_table_renders_one_row_per_measurement_with_a_bar():
    field = collective_benchmark(evidence_with())
    console = Console(file=io.StringIO(), width=160, no_color=True)
    console.print(benchmark_table(field, plain=True))
    text = console.file.getvalue()
    assert "collective benchmark: nccl on cuda, 2 ranks" in text
    assert "all_reduce" in text and "1 MiB" in text and "rank 1 (node7)" in text
    assert "#" * 24 in text, "the peak row's bar is full width"
