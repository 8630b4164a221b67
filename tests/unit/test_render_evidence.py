"""Evidence in words by its shape, so checks written later (config-sync, plugins) render well too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpdoctor.analysis.api import EvidenceRecord, Finding, evidence_field

from ddpdoctor.analysis.render.evidence import evidence_rows, format_value, number, ranks_text, record_text, size

from ddpdoctor.analysis.registry import load_checks

load_checks()  # the checks register their evidence types: a built-in check's dict evidence below is typed as theirs


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


SITE = {"file": "/job/train.py", "line": 31, "function": "main"}
NO_REPR = ("{'", "': ", "[{", '{"', '": ', "}]")


def all_text(rows: list[tuple[str, list[str]]]) -> str:
    return "\n".join(f"{label} {line}" for label, lines in rows for line in lines)


@dataclass(frozen=True)
class Moves(EvidenceRecord):
    """A typed record as a check declares it: the nested records' ``call`` reads as code."""

    case: str = evidence_field(default="device-round-trip", hidden=True)
    moves: list[dict[str, Any]] = evidence_field(default_factory=list, units={"call": "code"})


def test_a_list_of_records_reads_one_line_per_record_in_words():
    moves = [{"call": ".cpu()", "at": {"file": "/job/train.py", "line": 31}, "after_step": 1},
             {"call": ".cuda()", "at": SITE, "after_step": 1}]
    assert dict(evidence_rows(Moves(moves=moves))) == {
        "moves": ["`.cpu()` at train.py:31 after step 1", "`.cuda()` at train.py:31 (main) after step 1"]}
    # undeclared (a plugin's dict): the same phrases, the call as it is
    assert format_value(moves) == ".cpu() at train.py:31 after step 1; .cuda() at train.py:31 (main) after step 1"


def test_a_built_in_checks_dict_evidence_is_read_as_its_declared_record():
    """A saved report's (or a test's) dict for a built-in check gets that check's labels and units."""
    moves = [{"call": ".cpu()", "at": SITE, "after_step": 1}]
    finding = Finding(check="gradient-sync", severity="error", message="m", fix="f",
                      evidence={"case": "device-round-trip", "moves": moves})
    assert dict(evidence_rows(finding.evidence)) == {"moves": ["`.cpu()` at train.py:31 (main) after step 1"]}


def test_a_nested_record_reads_as_a_phrase_led_by_its_rank_with_the_site_named_once():
    changed_by = {"rank": 0, "via": "scheduler", "at": {"file": "/job/train.py", "line": 31},
                  "candidates": [SITE, {"file": "/lib/sched.py", "line": 9}], "before_step": 2}
    assert record_text(changed_by) == "rank 0: via scheduler at train.py:31 (main) before step 2"
    assert record_text({"rank": 1, "call": "Net.eval()", "at": SITE, "after_step": 2}) == \
        "rank 1: Net.eval() at train.py:31 (main) after step 2"
    assert record_text({"optimizer_built_at": SITE}) == "optimizer built at train.py:31 (main)"


def test_config_syncs_differences_show_once_in_words():
    differs = [{"what": "hyperparameter", "key": "0:lr", "label": "`lr`", "values": {"0": "0.045", "1": "0.05"},
                "text": "rank 0: 0.045; rank 1: 0.05"}]
    finding = Finding(check="config-sync", severity="error", message="m", fix="f", evidence={
        "what": ["`lr`: rank 0: 0.045; rank 1: 0.05", "`momentum`: rank 0: 0.9; rank 1: 0"], "step": 2,
        "differs": differs})
    rows = dict(evidence_rows(finding.evidence))
    assert rows == {"differs": ["`lr`: rank 0: 0.045; rank 1: 0.05", "`momentum`: rank 0: 0.9; rank 1: 0"],
                    "optimizer step": ["2"]}


def test_a_plugins_nested_evidence_renders_without_a_special_case():
    evidence = {"kind": "custom", "layers": [{"name": "encoder.0", "norm": 1.5, "ranks": [0, 2], "site": SITE},
                                             {"name": "encoder.1", "norm": 0.25, "ranks": [1], "shape": [4, 3]}],
                "worst": {"layer": "encoder.0", "per_rank": {"0": 1.5, "1": 0.25}, "detail": {"grad_norm": 2.0}},
                "by_rank": {"0": {"state": "eval", "since_step": 3}, "1": {"state": "train", "since_step": 1}},
                "pairs": [[1, 0], [2, 1]], "shapes": [[4, 3], [4]], "unknown": [None, None]}
    rows = evidence_rows(evidence)
    text = all_text(rows)
    assert not any(mark in text for mark in NO_REPR), text
    by_label = dict(rows)
    assert by_label["layers"] == ["ranks 0, 2: encoder.0 at train.py:31 (main), norm 1.5",
                                  "rank 1: encoder.1, norm 0.25, shape 4×3"]
    assert by_label["worst"] == ["encoder.0, per rank: rank 0: 1.5 · rank 1: 0.25, detail (grad norm 2)"]
    assert by_label["by rank"] == ["rank 0: eval since step 3", "rank 1: train since step 1"]
    assert by_label["pairs"] == ["(1, 0), (2, 1)"] and by_label["shapes"] == ["4×3, 4"]
    assert "unknown" not in by_label


def test_long_lists_of_records_are_cut_with_a_count():
    records = [{"call": f".m{i}()", "after_step": i} for i in range(9)]
    (row,) = evidence_rows({"calls_made": records})
    assert row[1][0] == ".m0() after step 0" and row[1][-1] == "… (3 more)" and len(row[1]) == 7
