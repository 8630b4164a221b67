"""global-batch (issue #33) under real torchrun, 2 gloo ranks on CPU, through the JSON report: the
three known-bad scripts each get exactly one global-batch warning at the loss line, with its figure;
their known-good twins (the global-count loss, fixed-length windows, Hugging Face's Trainer on padded
sequences, BatchNorm, dropout) are clean and say the weights were compared."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _line(fixture: str, text: str) -> int:
    source = (Path(__file__).parents[2] / "fixtures" / fixture).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if text in line]
    return number


# --against-one-rank: the first K steps replayed in one process on the union of the ranks' batches.
# The known-bad scripts' warnings are read from their replay runs: the replay is one more
# consequence of the same warning, found from the ranks' evidence alone (one run per script).
REPLAY = ("--against-one-rank", "3")


def _only_global_batch(run) -> dict:
    assert run.report is not None, run.output[-3000:]
    assert run.report["outcome"] == "completed", run.output[-3000:]
    assert run.report["probe_errors"] == []
    assert run.found() == {("global-batch", "warning")}, run.findings()
    assert run.returncode == 1  # --fail-on warning, the default
    (finding,) = run.findings("global-batch", "warning")
    return finding


def test_a_per_rank_token_mean_on_padded_sequences(run_check):
    fixture = "bad_global_batch_padded_lm.py"
    finding = _only_global_batch(run_check(fixture, *REPLAY))
    assert finding["location"]["line"] == _line(fixture, "loss = F.cross_entropy(")
    evidence = finding["evidence"]
    assert evidence["case"] == "unequal-weights" and evidence["loss"] == "cross_entropy (mean)"
    assert evidence["step"] == 1 and evidence["steps_unequal"] >= evidence["steps_compared"] - 2
    counts = evidence["counts"]
    heavier, lighter = sorted(counts, key=lambda r: counts[r][0])
    assert evidence["weight_ratio"] == round(counts[lighter][0] / counts[heavier][0], 4) > 1.05
    assert f"rank {heavier}'s elements weigh" in finding["message"]
    # measured from the ranks' local gradients (an independent replay of step 1 gives 7.4% on the same
    # 80 coordinates, 7.7% over every coordinate)
    assert evidence["coordinates"] == 80 and 0.03 < evidence["gradient_distance"] < 0.15
    assert "away from the global batch's (relative L2 over 80 sampled coordinates)" in finding["message"]


def test_a_loss_divided_by_the_world_size(run_check):
    fixture = "bad_global_batch_world_size.py"
    finding = _only_global_batch(run_check(fixture, *REPLAY))
    assert finding["location"]["line"] == _line(fixture, "loss = criterion(model(x), y)")
    evidence = finding["evidence"]
    assert (evidence["case"], evidence["factor"], evidence["world_size"]) == ("world-size-scaling", 0.5, 2)
    assert evidence["scaled_at"]["line"] == _line(fixture, "loss = loss / world_size")
    assert "the update is 1/2 of the global batch's" in finding["message"]


def test_a_mean_of_means_over_accumulated_micro_batches(run_check):
    fixture = "bad_global_batch_accumulation.py"
    finding = _only_global_batch(run_check(fixture, *REPLAY))
    assert finding["location"]["line"] == _line(fixture, "loss = F.cross_entropy(")
    evidence = finding["evidence"]
    assert evidence["case"] == "unequal-weights"
    assert [len(c) for c in evidence["counts"].values()] == [4, 4]  # four micro-batches per rank
    assert "over 4 micro-batches" in finding["message"]
    assert evidence["gradient_distance"] > 0.01  # each micro-batch's contribution from the accumulated reads


# A good twin whose replay agrees is read from its replay run: the replay's sentence follows the
# ranks' own in the check's summary, so one run serves both tests.
REPLAYED_TWINS = ("good_global_batch_global_count.py",)


@pytest.mark.parametrize("fixture", [
    "good_global_batch_global_count.py", "good_global_batch_fixed_windows.py",
    pytest.param("good_hf_trainer_sft_padding.py", marks=pytest.mark.realcode),  # HF's Trainer: the realcode tier
    "good_batchnorm.py", "good_dropout.py"])
def test_every_element_weighs_the_same_in_the_good_twins(run_check, fixture):
    run = run_check(fixture, *(REPLAY if fixture in REPLAYED_TWINS else ()))
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(), run.findings()
    assert run.returncode == 0, run.output[-3000:]
    (check,) = [c for c in run.report["checks"] if c["id"] == "global-batch"]
    assert check["status"] == "pass", check
    assert check["summary"].startswith("every element of the global batch weighs the same at ")


def _replayed(run) -> dict:
    """The one global-batch warning, whose consequence is the replay's difference."""
    finding = _only_global_batch(run)
    (consequence,) = [c for c in finding["consequences"] if c["evidence"].get("case") == "one-rank-differs"]
    assert consequence["severity"] == "warning"
    return consequence["evidence"] | {"message": consequence["message"]}


@pytest.mark.parametrize("fixture", ["bad_global_batch_padded_lm.py", "bad_global_batch_accumulation.py"])
def test_the_replay_names_the_first_step_where_n_ranks_differ_from_one(run_check, fixture):
    replay = _replayed(run_check(fixture, *REPLAY))
    assert (replay["step"], replay["quantity"], replay["steps_compared"]) == (1, "gradient", 3)
    assert replay["parameter"] in {"embed.weight", "hidden.weight", "hidden.bias", "head.weight", "head.bias"}
    # a few percent (unequal token weights) against a rounding bound of about 1e-5
    assert replay["distance"] > 0.01 and replay["tolerance"] < 1e-3
    assert replay["loss_ranks"] != pytest.approx(replay["loss_one"], rel=1e-5)
    assert "from step 1" in replay["message"] and "beyond the rounding bound" in replay["message"]


def test_the_replay_measures_the_world_size_division_as_a_factor(run_check):
    replay = _replayed(run_check("bad_global_batch_world_size.py", *REPLAY))
    assert (replay["step"], replay["distance"], replay["scale"]) == (1, 0.5, 0.5)
    assert replay["loss_one"] == pytest.approx(2 * replay["loss_ranks"], rel=1e-5)
    assert "the averaged gradient is 0.5x one process's = 1/2, the world size" in replay["message"]


@pytest.mark.parametrize("fixture", ["good_global_batch_global_count.py", "good_ddp_tutorial.py"])
def test_the_replay_agrees_within_rounding_on_good_twins(run_check, fixture):
    run = run_check(fixture, *REPLAY)
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(), run.findings()
    (check,) = [c for c in run.report["checks"] if c["id"] == "global-batch"]
    assert check["status"] == "pass" and "a one-process replay of 3 steps agrees within rounding" in check["summary"]


@pytest.mark.parametrize(("fixture", "limit"), [
    ("good_dropout.py", "dropout `dropout` (p=0.5): each rank draws its own masks"),
    ("good_batchnorm.py", "BatchNorm `bn1`: each rank normalizes its batch with its own statistics"),
    ("good_global_batch_fixed_windows.py", "took no batch from a DataLoader the ranks recorded"),
])
def test_the_replay_says_what_limits_an_exact_comparison_instead_of_a_difference(run_check, fixture, limit):
    run = run_check(fixture, *REPLAY)
    assert run.report is not None, run.output[-3000:]
    assert run.found() == {("global-batch", "info")}, run.findings()
    assert run.returncode == 0  # an info does not fail the run
    (finding,) = run.findings("global-batch", "info")
    assert finding["evidence"]["case"] == "one-rank-limited"
    assert any(limit in text for text in finding["evidence"]["limits"]), finding["evidence"]["limits"]
    assert "cannot compare exactly" in finding["message"]
