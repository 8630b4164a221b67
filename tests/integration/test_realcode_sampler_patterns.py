"""sampler-disjoint on the patterns of real training code that overlapped by design (bench/realcode's
false positives of 2026-11-25), each known-good beside the known-bad twin that draws the line:

- llama2.c's PretokDataset: an IterableDataset sampled at random per rank (info), against the same
  stream read in the same order on every rank (error);
- Accelerate's even_batches padding a whole batch under BatchSamplerShard (info naming the sampler);
- open_clip's synthetic dataset: identical samples behind disjoint positions (info), against a
  dataset that ignores its index (error);
- DeiT's RASampler: repetition by a sampler that knows the ranks (info), against a rank-aware
  sampler seeded by the rank (error);
- Fabric's k-fold SubsetRandomSampler wrapped in a DistributedSamplerWrapper: the fold is what the
  loader covers (clean).

Real torchrun, 2 gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.realcode]


def line_of(fixture: str, text: str) -> int:
    """The line of ``fixture`` that holds ``text`` (exactly one)."""
    lines = [n for n, line in enumerate((FIXTURES / fixture).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (fixture, text, lines)
    return lines[0]


def only(run, severity: str) -> dict:
    """The run's one top-level sampler-disjoint finding, of ``severity``; nothing else was found."""
    assert run.report is not None, run.output[-3000:]
    assert run.found() == {("sampler-disjoint", severity)}, (run.findings(), run.output[-3000:])
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    assert run.returncode == (1 if severity == "error" else 0), run.output[-3000:]
    (finding,) = run.findings("sampler-disjoint")
    assert finding["ranks"] == [0, 1]
    return finding


def at(finding: dict, fixture: str, text: str) -> None:
    assert finding["location"]["file"].endswith("/" + fixture), finding["location"]
    assert finding["location"]["line"] == line_of(fixture, text)


# -- llama2.c: an IterableDataset seeded by rank ------------------------------------------------------

def test_an_iterable_dataset_sampled_at_random_per_rank_is_info(run_check):
    fixture = "good_iterable_rank_seeded_sampling.py"
    finding = only(run_check(fixture), "info")
    at(finding, fixture, "loader = DataLoader(PretokWindows(")
    evidence = finding["evidence"]
    assert evidence["kind"] == "random-draws" and evidence["basis"] == "content"
    assert evidence["overlap_fraction"] > 0.2  # far above what draws spread over a corpus would share
    assert evidence["shared_order_correlation"] < 0.5
    assert 100 < evidence["pool_estimate"] < 600  # 256 windows in the pool
    assert finding["message"].startswith(
        f"{round(100 * evidence['overlap_fraction'])}% of the samples each rank trained on in pass 0 of the "
        "training DataLoader over PretokWindows (an IterableDataset) were also fed to another rank, in unrelated "
        "orders: each rank draws its own random sample from one pool of about")
    assert finding["consequences"] == []


def test_the_same_stream_read_in_the_same_order_on_every_rank_is_an_error(run_check):
    finding = only(run_check("bad_iterable_same_seed_stream.py"), "error")
    at(finding, "good_iterable_rank_seeded_sampling.py", "loader = DataLoader(PretokWindows(")
    assert finding["evidence"]["overlap_fraction"] == 1.0
    assert finding["evidence"]["shared_order_correlation"] == 1.0
    assert finding["message"] == (
        "100% of the samples each rank trained on in pass 0 of the training DataLoader over PretokWindows were also "
        f"fed to another rank (chance would give {100 * finding['evidence']['expected_fraction']:.1f}%): an "
        "IterableDataset has no sampler: every rank reads what its __iter__ yields, and the ranks read one stream "
        "in the same order")
    assert "by rank and by worker" in finding["fix"]
    assert finding["consequences"] == []


# -- Accelerate: even_batches pads a whole batch ------------------------------------------------------

def test_a_whole_batch_of_even_batches_padding_is_info_naming_the_sampler_that_draws(run_check):
    fixture = "good_accelerate_even_batches_shuffle.py"
    finding = only(run_check(fixture), "info")
    at(finding, fixture, "accelerator.prepare(model, optimizer, loader)")
    assert finding["message"] == ("the sampler (RandomSampler under BatchSamplerShard) padded the training "
                                  "DataLoader with 96 repeated samples so every rank gets the same count (480 "
                                  "samples on 2 ranks)")
    assert finding["evidence"]["sampler"] == "RandomSampler"
    assert finding["evidence"]["batch_sampler"] == "BatchSamplerShard"
    assert finding["evidence"]["num_padding_duplicates"] == 96
    assert finding["consequences"] == []


# -- open_clip: a synthetic dataset of identical samples ------------------------------------------------

def test_identical_batches_of_identical_samples_behind_disjoint_positions_are_info(run_check):
    fixture = "good_identical_synthetic_samples.py"
    finding = only(run_check(fixture), "info")
    at(finding, fixture, 'F.cross_entropy(model(batch["image"])')
    assert finding["message"] == (
        "ranks 0, 1 fed identical batches to DDP at 8 of 8 training forwards, but the DataLoader at "
        f"{fixture}:{line_of(fixture, 'loader = DataLoader(')} gave them disjoint samples of one dataset: the "
        "dataset holds identical samples (a synthetic or constant dataset?), not a sharding bug")
    assert finding["evidence"]["kind"] == "identical-samples"
    assert finding["consequences"] == []


def test_identical_batches_from_a_dataset_that_ignores_its_index_are_an_error(run_check):
    fixture = "bad_dataset_ignores_index.py"
    finding = only(run_check(fixture), "error")
    at(finding, fixture, 'F.cross_entropy(model(batch["image"])')
    assert finding["message"] == (
        "ranks 0, 1 fed identical batches to DDP at 8 of 8 training forwards (the same batch at the same step): "
        "every rank trains on the same data, so the job does one rank's work N times; the batches came from the "
        f"DataLoader at {fixture}:{line_of(fixture, 'loader = DataLoader(')}, although its sampler gave the ranks "
        "disjoint positions of one dataset: the dataset's items do not follow the index they are asked for")
    assert "`__getitem__(index)`" in finding["fix"]
    assert finding["consequences"] == []


# -- DeiT: repeated augmentation ------------------------------------------------------------------------

def test_a_rank_aware_sampler_repeating_every_sample_on_purpose_is_info(run_check):
    fixture = "good_repeated_augmentation_sampler.py"
    finding = only(run_check(fixture), "info")
    at(finding, fixture, "loader = DataLoader(data, batch_size=32, sampler=sampler)")
    assert finding["message"] == ("RASampler draws every sample 3 times across the 2 ranks on purpose (repeated "
                                  "augmentation): it knows the ranks (num_replicas=2 and each rank's own rank), so "
                                  "171 of 512 samples of the training DataLoader were drawn by more than one rank in "
                                  "pass 0")
    assert finding["evidence"]["repeats"] == 3 and finding["evidence"]["kind"] == "repetition"
    assert finding["evidence"]["num_passes_affected"] == 2
    assert finding["consequences"] == []


def test_a_rank_aware_sampler_seeded_by_the_rank_is_an_error_with_its_content_twin(run_check):
    finding = only(run_check("bad_sampler_custom_rank_seed.py"), "error")
    at(finding, "good_repeated_augmentation_sampler.py", "loader = DataLoader(data, batch_size=32, sampler=sampler)")
    assert finding["message"] == (f"{finding['evidence']['num_shared']} of 512 samples of the training DataLoader "
                                  "were drawn by more than one rank in pass 0 (sampler ShardSampler)")
    assert finding["fix"].startswith("ShardSampler knows the ranks, yet their draws overlap")
    (twin,) = finding["consequences"]
    assert twin["check"] == "sampler-disjoint" and twin["evidence"]["basis"] == "content"
    assert twin["message"].endswith("the sampler drew the same positions on several ranks")


def test_a_distributed_sampler_with_the_wrong_replicas_stays_an_error(run_check):
    finding = only(run_check("bad_sampler_wrong_replicas.py"), "error")
    assert finding["message"] == "256 of 512 samples of the training DataLoader were drawn by no rank in pass 0"


# -- Fabric k-fold: a fold sampler wrapped for the ranks --------------------------------------------------

def test_a_wrapped_fold_sampler_covers_its_fold_not_the_dataset(run_check):
    run = run_check("good_fabric_kfold_subset_sampler.py")
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(), (run.findings(), run.output[-3000:])
    assert run.returncode == 0 and run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    (check,) = [c for c in run.report["checks"] if c["id"] == "sampler-disjoint"]
    assert check["status"] == "pass" and "shards disjoint" in check["summary"]
