"""--against-one-rank's judgement on synthetic replays: the rounding bound, the first differing step
and parameter, a single factor named as the world size, and the replays that must not be judged
(limits, a precision too coarse, a replay that could not run)."""

from __future__ import annotations

import math

from builders import ddp_wrap, init_pg, make_evidence

from ddpdoctor.analysis.one_rank import LAMBDA, UNIT_ROUNDOFF, judge, tolerance
from ddpdoctor.checks.global_batch import analyze
from ddpdoctor.schema.observations import OneRankReplay


def _param(name: str, ranks: list[float], one: list[float]) -> list:
    """[name, |g_N - g_1|, |g_N|, |g_1|, <g_N, g_1>] of two small gradients, as the replay measures them."""
    def norm(v: list[float]) -> float:
        return math.sqrt(sum(x * x for x in v))
    return [name, norm([a - b for a, b in zip(ranks, one)]), norm(ranks), norm(one),
            sum(a * b for a, b in zip(ranks, one))]


def _replay(*steps: list[list], losses=(1.0, 1.0), **fields) -> OneRankReplay:
    fields.setdefault("rows", 4096)
    fields.setdefault("fan_in", 64)
    return OneRankReplay(world_size=2, steps_requested=len(steps), batches="joined", steps=[
        {"optimizer": 0, "step": i + 1, "loss_ranks": losses[0], "loss_one": losses[1], "params": params}
        for i, params in enumerate(steps)], **fields)


def test_the_tolerance_is_the_probabilistic_bound_for_the_longest_sum():
    replay = _replay(rows=4096, fan_in=64)
    assert tolerance(replay) == LAMBDA * math.sqrt(4096 * 64) * UNIT_ROUNDOFF["float32"]
    assert tolerance(_replay(rows=1 << 20, fan_in=4096, precision="bfloat16")) is None  # above 10%: no bound


def test_agreement_within_rounding_is_no_difference():
    same = _param("fc.weight", [1.0, 2.0, 3.0], [1.0 + 1e-7, 2.0, 3.0])
    judged = judge(_replay([same], [same]))
    assert judged.difference is None and judged.steps == 2 and 0 < judged.largest < judged.tolerance


def test_the_first_differing_step_and_its_furthest_parameter_are_named():
    same = _param("fc.weight", [1.0, 2.0], [1.0, 2.0])
    off = _param("fc.bias", [1.0, 1.0], [1.0, 1.1])
    judged = judge(_replay([same], [same, off], losses=(2.0, 2.0)))
    d = judged.difference
    assert (d.step, d.what, d.parameter) == (2, "gradient", "fc.bias")
    assert math.isclose(d.distance, 0.1 / math.sqrt(2.21), rel_tol=1e-9)
    assert d.scale is None  # no single factor explains it


def test_a_loss_off_with_equal_gradients_is_a_loss_difference():
    same = _param("fc.weight", [1.0, 2.0], [1.0, 2.0])
    d = judge(_replay([same], losses=(1.0, 1.5))).difference
    assert (d.what, d.parameter, round(d.distance, 4)) == ("loss", None, 0.3333)


def test_a_single_factor_over_every_parameter_is_measured():
    half = [_param("a", [0.5, 1.0], [1.0, 2.0]), _param("b", [1.5], [3.0])]
    d = judge(_replay(half, losses=(0.5, 1.0))).difference
    assert math.isclose(d.scale, 0.5)


def test_limits_are_never_judged():
    off = _param("fc.bias", [1.0], [2.0])
    judged = judge(_replay([off], limits=["dropout `drop` (p=0.1) draws its masks on each rank"]))
    assert judged.difference is None and judged.limits and judged.largest == 0.5


def _evidence(replay: OneRankReplay):
    return make_evidence(2, [init_pg(2), ddp_wrap()], one_rank=replay)


def test_the_check_warns_with_the_figure_and_names_the_world_size_factor():
    half = [_param("fc.weight", [0.5, 1.0], [1.0, 2.0])]
    result = analyze(_evidence(_replay(half, losses=(0.5, 1.0))))
    (finding,) = result.findings
    assert finding.severity == "warning"
    e = finding.evidence
    assert (e.step, e.quantity, e.parameter, e.distance, e.scale) == (1, "gradient", "fc.weight", 0.5, 0.5)
    assert "from step 1, `fc.weight`'s gradient is 50.00% away from one process's" in finding.message
    assert "0.5x one process's = 1/2, the world size" in finding.message


def test_the_check_passes_an_agreeing_replay_and_says_so():
    same = [_param("ddp1:fc.weight", [1.0, 2.0], [1.0, 2.0])]
    result = analyze(_evidence(_replay(same, same)))
    assert result.findings == [] and "a one-process replay of 2 steps agrees within rounding" in result.summary


def test_the_check_gives_limits_as_info_never_a_difference():
    off = [_param("fc.weight", [1.0], [2.0])]
    result = analyze(_evidence(_replay(off, limits=["BatchNorm `bn` normalizes each rank's batch"])))
    (finding,) = result.findings
    assert finding.severity == "info" and finding.evidence.limits == ["BatchNorm `bn` normalizes each rank's batch"]
    assert "cannot compare exactly" in finding.message and "not judged" in finding.message


def test_a_replay_that_could_not_run_is_info():
    result = analyze(_evidence(OneRankReplay(world_size=2, steps_requested=3, error="it exited with 1")))
    (finding,) = result.findings
    assert finding.severity == "info" and "could not compare: it exited with 1" in finding.message
