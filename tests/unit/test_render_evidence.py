"""Evidence in words by its shape, so checks written later (config-sync, plugins) render well too."""

from __future__ import annotations

from ddpdoctor.analysis.render.evidence import evidence_rows, format_value, number, ranks_text, size


def test_numbers_keep_three_significant_digits_and_units():
    assert [number(v) for v in (0.29843388736887105, 12.345, 4096, 3.0, 1234567.8, 0.00012)] == \
        ["0.298", "12.3", "4,096", "3", "1,234,568", "1.20e-04"]
    assert size(123456) == "121 KiB" and size(512) == "512 B"
    assert format_value(0.0123, "wait_s") == "12.3 ms" and format_value(2.5, "peak_gbps") == "2.5 GB/s"
    assert format_value(True) == "yes" and format_value(None) == "-"


def test_rank_maps_group_equal_values_and_collapse_rank_runs():
    assert format_value({"0": 3, "1": 3}) == "3 on ranks 0, 1"
    assert format_value({"0": 1, "1": 2, "2": 1}) == "ranks 0, 2: 1 · rank 1: 2"
    assert format_value({str(r): 7 for r in range(1024)}) == "7 on ranks 0-1023"
    assert ranks_text([5, 0, 1, 2, 3, 9]) == "ranks 0-3, 5, 9"


def test_lists_and_sites_and_unknown_nesting_never_print_json():
    assert format_value(list(range(20))) == "0, 1, 2, 3, 4, 5, 6, 7, … (12 more)"
    assert format_value([{"file": "/x/train.py", "line": 31, "function": "main"}, {"file": "/x/a.py", "line": 2}]) == \
        "train.py:31 (main)"
    text = format_value({"a": {"b": {"c": {"d": [1, {"e": 2}]}}}})
    assert "{" not in text and '"' not in text


def test_a_check_written_later_renders_without_a_special_case():
    evidence = {"kind": "train-flag", "module": "encoder.dropout", "training": {"0": True, "1": False},
                "lr": {"0": 0.1, "1": 0.01}, "first_step": 3, "loss_scale_s": 0.5}
    rows = dict((label, lines) for label, lines in evidence_rows(evidence))
    assert "kind" not in rows
    assert rows["module"] == ["encoder.dropout"]
    assert rows["training"] == ["rank 0: yes · rank 1: no"]
    assert rows["lr"] == ["rank 0: 0.1 · rank 1: 0.01"]
    assert rows["first step"] == ["3"] and rows["loss scale"] == ["500 ms"]
