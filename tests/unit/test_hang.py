"""HangDetector: adaptive and fixed thresholds, stalled ranks, reset. Clock values are passed in."""

from __future__ import annotations

import pytest

from ddpdoctor.hang import MIN_ADAPTIVE_S, STEP_FACTOR, HangDetector


def test_default_threshold_is_30_seconds_before_any_step():
    assert MIN_ADAPTIVE_S == 30.0 and STEP_FACTOR == 10.0
    assert HangDetector().threshold_s() == 30.0


def test_adaptive_threshold_is_ten_times_the_slowest_step():
    d = HangDetector()
    d.observe(0.0, 0, progress=1, steps=0)
    d.observe(10.0, 0, progress=2, steps=1)  # the first step has no start time: not measured
    assert d.threshold_s() == 30.0
    d.observe(15.0, 0, progress=3, steps=2)  # a 5 s step
    assert d.threshold_s() == pytest.approx(50.0)
    d.observe(16.0, 0, progress=4, steps=4)  # two 0.5 s steps do not lower it
    assert d.threshold_s() == pytest.approx(50.0)


def test_fast_steps_keep_the_30_second_floor():
    d = HangDetector()
    for i in range(5):
        d.observe(float(i), 0, progress=i, steps=i)  # 1 s steps: 10 x 1 s < 30 s
    assert d.threshold_s() == 30.0


def test_slowest_step_of_any_rank_counts():
    d = HangDetector()
    d.observe(0.0, 0, 1, 1)
    d.observe(0.0, 1, 1, 1)
    d.observe(2.0, 0, 2, 2)
    d.observe(8.0, 1, 2, 2)  # rank 1: a 8 s step
    assert d.threshold_s() == pytest.approx(80.0)


def test_fixed_threshold_overrides_the_adaptive_one():
    d = HangDetector(fixed_timeout_s=5.0)
    d.observe(0.0, 0, 1, 1)
    d.observe(100.0, 0, 2, 2)  # a 100 s step would give 1000 s adaptively
    assert d.threshold_s() == 5.0


def test_stalled_ranks_are_the_live_ones_without_progress_past_the_threshold():
    d = HangDetector()
    d.observe(0.0, 0, progress=7, steps=0)
    d.observe(0.0, 1, progress=7, steps=0)
    d.observe(0.0, 2, progress=7, steps=0)
    d.observe(20.0, 1, progress=8, steps=0)
    d.observe(25.0, 0, progress=7, steps=0)  # same progress: still stalled since t=0
    assert d.stalled(30.0, {0, 1, 2}) == []  # exactly at the threshold is not past it
    assert d.stalled(31.0, {0, 1, 2}) == [0, 2]
    assert d.stalled(31.0, {0, 1}) == [0]  # rank 2 is not live
    assert d.stalled(31.0, {0, 1, 5}) == [0]  # rank 5 never observed
    assert d.stall_age(31.0, 0) == pytest.approx(31.0)
    assert d.stall_age(31.0, 1) == pytest.approx(11.0)
    assert d.stall_age(31.0, 5) == 0.0


def test_stalled_with_a_fixed_threshold():
    d = HangDetector(fixed_timeout_s=2.0)
    d.observe(0.0, 0, 1, 0)
    assert d.stalled(2.0, {0}) == []
    assert d.stalled(2.5, {0}) == [0]


def test_reset_forgets_a_stall_judged_to_be_computation():
    d = HangDetector()
    d.observe(0.0, 0, 1, 0)
    assert d.stalled(40.0, {0}) == [0]
    d.reset(0, 40.0)
    assert d.stalled(41.0, {0}) == []
    assert d.stalled(71.0, {0}) == [0]
    d.reset(9, 40.0)  # unknown rank: nothing to forget
    assert 9 not in d.ranks
