"""Data audit by content: overlap that sample indices cannot show (iterable datasets, per-rank file
orders, hand-written batching), and streams that repeat their order every epoch.

Real torchrun, 2 gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

# fixture -> (dataset class, iterable, words the fix must contain)
CONTENT_OVERLAP = {
    "bad_content_iterable_whole.py": ("DigitStream", True, ("by rank and by worker", "get_worker_info")),
    "bad_content_iterable_worker_shard.py": ("DigitStream", True, ("by rank and by worker",)),
    "bad_content_file_order.py": ("FileDataset", False, ("sort the file list", "fixed seed")),
}

CLEAN = ["good_content_random_windows.py", "good_content_augmentation.py", "good_content_duplicates.py"]


@pytest.mark.parametrize("fixture", sorted(CONTENT_OVERLAP))
def test_overlap_by_content_is_one_sampler_disjoint_error(run_check, fixture):
    dataset_type, iterable, fix_words = CONTENT_OVERLAP[fixture]
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.returncode == 1, run.output[-3000:]
    assert run.found() == {("sampler-disjoint", "error")}, (run.findings(), run.output[-3000:])
    (finding,) = run.findings("sampler-disjoint")
    evidence = finding["evidence"]
    assert evidence["basis"] == "content"
    assert evidence["source"] == "loader"
    assert evidence["dataset_type"] == dataset_type
    assert evidence["iterable"] is iterable
    assert evidence["overlap_fraction"] >= 0.3
    assert evidence["overlap_fraction"] > 4 * evidence["expected_fraction"]
    assert evidence["forward_overlap"] is True
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["file"].endswith(fixture)
    assert dataset_type in finding["message"]
    assert all(word in finding["fix"] for word in fix_words), finding["fix"]
    assert finding["consequences"] == []


def test_worker_only_sharding_names_the_workers(run_check):
    (finding,) = run_check("bad_content_iterable_worker_shard.py").findings("sampler-disjoint")
    assert finding["evidence"]["num_workers"] == 2
    assert "sharding by worker alone is not enough" in finding["message"]


def test_index_overlap_keeps_its_content_twin_as_a_consequence(run_check):
    run = run_check("bad_sampler_no_distributed.py")
    assert run.found() == {("sampler-disjoint", "error")}, run.output[-3000:]
    (root,) = run.findings("sampler-disjoint")
    assert root["evidence"].get("basis", "indices") == "indices"
    twins = [c for c in run.consequences("sampler-disjoint") if c["evidence"].get("basis") == "content"]
    assert len(twins) == 1 and twins[0]["check"] == "sampler-disjoint", run.consequences()


@pytest.mark.parametrize("fixture", CLEAN)
def test_legitimate_repeats_stay_clean(run_check, fixture):
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.returncode == 0, run.output[-3000:]
    assert run.findings() == [], run.findings()
    status = {c["id"]: c["status"] for c in run.report["checks"]}
    assert status["sampler-disjoint"] == "pass", run.report["checks"]


def test_hand_written_batches_are_compared_by_content(run_check):
    run = run_check("good_content_random_windows.py")
    summary = next(c["summary"] for c in run.report["checks"] if c["id"] == "sampler-disjoint")
    assert "compared by content" in summary


@pytest.mark.parametrize("flags, message", [
    (("--reshuffle", "--forget-set-epoch"), "set_epoch is never called"),
    (("--fixed-permutation",), "same permutation every epoch"),
])
def test_a_stream_meant_to_be_reshuffled_in_the_same_order_every_epoch_is_a_set_epoch_warning(
        run_check, flags, message):
    run = run_check("stream_epoch_order.py", script_args=list(flags))
    assert run.returncode == 1, run.output[-3000:]
    assert run.found() == {("set-epoch", "warning")}, run.output[-3000:]
    (finding,) = run.findings("set-epoch")
    assert finding["ranks"] == [0, 1]
    assert finding["evidence"]["basis"] == "content"
    assert message in finding["message"]
    assert "epoch" in finding["fix"]


def test_a_stream_in_its_natural_order_every_epoch_is_info_at_most(run_check):
    run = run_check("stream_epoch_order.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == {("set-epoch", "info")}, run.findings()
    (finding,) = run.findings("set-epoch")
    assert finding["severity"] == "info" and finding["evidence"]["dataset_type"] == "ShardedStream"


def test_stream_reshuffled_every_epoch_stays_clean(run_check):
    run = run_check("stream_epoch_order.py", script_args=["--reshuffle"])
    assert run.returncode == 0, run.output[-3000:]
    assert run.findings() == [], run.findings()
