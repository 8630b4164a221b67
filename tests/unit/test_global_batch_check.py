"""global-batch on synthetic loss windows: elements of one global batch that weigh differently (a
per-rank or per-micro-batch mean over unequal counts), a loss scaled by the world size on a line
naming it, and the correct forms that stay silent."""

from __future__ import annotations

from builders import SCRIPT, ddp_wrap, init_pg, make_evidence, sharded

from ddpdoctor.checks.global_batch import analyze
from ddpdoctor.schema.events import LossWindow

LOSS_LINE = 31


def _call(count: int, *, factor: float | None = 1.0, reduction: str = "mean", elementwise: bool = False,
          line: int = LOSS_LINE) -> dict:
    return {"fn": "cross_entropy", "reduction": reduction, "count": count, "numel": 200, "factor": factor,
            "elementwise": elementwise, "site": [{"file": SCRIPT, "line": line, "function": "main"}]}


def _window(step: int, *calls: dict, means=(), scaling_line: int | None = None) -> LossWindow:
    return LossWindow(step=step, backwards=max(1, len(calls)), calls=list(calls), means=list(means),
                      backward_at=[{"file": SCRIPT, "line": 40, "function": "main"}],
                      scaling_at=[{"file": SCRIPT, "line": scaling_line, "function": "main"}] if scaling_line else [])


def _job(windows: dict[int, list[LossWindow]], *, wrap=None, world_size: int = 2):
    return make_evidence(world_size, {rank: [init_pg(world_size), wrap or ddp_wrap(), *events]
                                      for rank, events in windows.items()})


def test_a_per_rank_mean_over_unequal_token_counts_is_a_warning_with_its_figure():
    result = analyze(_job({0: [_window(1, _call(100)), _window(2, _call(90))],
                           1: [_window(1, _call(55)), _window(2, _call(90))]}))
    (finding,) = result.findings
    assert (finding.severity, finding.ranks, finding.location.line) == ("warning", (0, 1), LOSS_LINE)
    evidence = finding.evidence
    assert (evidence.step, evidence.weight_ratio, evidence.steps_compared, evidence.steps_unequal) == (1, 1.8182, 2, 1)
    assert evidence.counts == {"0": [100], "1": [55]}
    assert "rank 1's elements weigh 1.82x rank 0's at step 1" in finding.message


def test_a_mean_of_means_over_unequal_micro_batches_is_named_within_the_rank():
    quarter = 0.25
    result = analyze(_job({r: [_window(1, *(_call(c, factor=quarter) for c in (40, 40, 80, 40)))] for r in (0, 1)}))
    (finding,) = result.findings
    assert finding.evidence.counts == {"0": [40, 40, 80, 40], "1": [40, 40, 80, 40]}
    assert finding.evidence.weight_ratio == 2.0
    assert "over 4 micro-batches" in finding.message


def test_a_hand_written_masked_mean_divided_by_each_ranks_count():
    """(loss * mask).sum() / mask.sum(): the probe gives each kept element the factor 1/mask.sum()."""
    masked = _job({0: [_window(1, _call(64, factor=1 / 40, reduction="none"))],
                   1: [_window(1, _call(64, factor=1 / 25, reduction="none"))]})
    (finding,) = analyze(masked).findings
    assert finding.evidence.counts == {"0": [40], "1": [25]} and finding.evidence.weight_ratio == 1.6
    assert "`cross_entropy` (none) is divided by each rank's own count" in finding.message


def test_equal_weights_stay_silent():
    """Equal counts with a mean; a sum divided by the global count; fixed windows with /4."""
    equal = _job({r: [_window(1, _call(64)), _window(2, _call(64))] for r in (0, 1)})
    global_count = _job({0: [_window(1, _call(100, factor=2 / 155, reduction="sum"))],
                         1: [_window(1, _call(55, factor=2 / 155, reduction="sum"))]})
    windows = _job({r: [_window(1, *(_call(64, factor=0.25) for _ in range(4)))] for r in (0, 1)})
    for evidence in (equal, global_count, windows):
        result = analyze(evidence)
        assert (result.findings, result.status) == ([], "pass"), result.summary
    assert analyze(equal).summary == "every element of the global batch weighs the same at 2 compared steps"


def test_tiny_differences_and_unjudged_losses_are_no_evidence():
    """Counts within 1%; a loss never reached from a backward (logged); an elementwise weighting."""
    close = _job({0: [_window(1, _call(1000))], 1: [_window(1, _call(1005))]})
    assert analyze(close).findings == []
    unreached = _job({0: [_window(1, _call(100, factor=None))], 1: [_window(1, _call(50, factor=None))]})
    assert analyze(unreached).status == "skip"
    masked = _job({0: [_window(1, _call(100, elementwise=True))], 1: [_window(1, _call(50, elementwise=True))]})
    assert analyze(masked).findings == []


def test_a_loss_divided_by_the_world_size_on_a_line_naming_it():
    result = analyze(_job({r: [_window(n, _call(32, factor=0.5), scaling_line=32) for n in (1, 2)] for r in (0, 1)}))
    (finding,) = result.findings
    assert (finding.severity, finding.location.line) == ("warning", LOSS_LINE)
    assert (finding.evidence.factor, finding.evidence.world_size, finding.evidence.steps_compared) == (0.5, 2, 2)
    assert finding.evidence.scaled_at == {"file": SCRIPT, "line": 32}
    assert "divided by the world size (2) at train.py:32" in finding.message


def test_a_factor_of_one_over_w_without_a_line_naming_the_world_size_is_no_evidence():
    """0.5 * mse_loss with two ranks: correct code scaling its loss by a half."""
    means = [{"node": "mse_loss", "factor": 0.5, "site": []}]
    assert analyze(_job({r: [_window(1, means=means)] for r in (0, 1)})).findings == []
    assert analyze(_job({r: [_window(1, _call(32, factor=0.5))] for r in (0, 1)})).findings == []


def test_accumulation_that_divides_by_its_steps_is_no_world_size_scaling():
    """Two micro-batches divided by 2 with two ranks: the window's factors sum to 1."""
    windows = {r: [_window(1, _call(32, factor=0.5), _call(32, factor=0.5), scaling_line=32)] for r in (0, 1)}
    assert analyze(_job(windows)).findings == []


def test_sharded_models_are_judged_and_jobs_without_averaging_are_not():
    fsdp = _job({0: [_window(1, _call(100))], 1: [_window(1, _call(50))]}, wrap=sharded())
    assert len(analyze(fsdp).findings) == 1
    alone = make_evidence(2, {r: [init_pg(2), _window(1, _call(100 - 50 * r))] for r in (0, 1)})
    assert analyze(alone).status == "skip"
    assert analyze(make_evidence(1, {0: [init_pg(1), ddp_wrap(), _window(1, _call(10))]})).status == "skip"


def test_the_distance_from_the_global_batchs_gradient_is_computed_from_local_gradients():
    """Rank 0 averages 100 elements whose gradients sum to G0, rank 1 50 summing to G1 (one backward
    each, factor 1): DDP's average is (G0/100 + G1/50)/2, the global batch's (G0 + G1)/150."""
    g0, g1 = [30.0, -10.0, 5.0], [-20.0, 40.0, 5.0]
    layout = [[0, 0, 3]]
    windows = {rank: [LossWindow(step=1, backwards=1, calls=[_call(n)], grad_layout=layout,
                                 grad_samples=[[v / n for v in g]])]
               for rank, (n, g) in enumerate(((100, g0), (50, g1)))}
    (finding,) = analyze(_job(windows)).findings
    averaged = [(a / 100 + b / 50) / 2 for a, b in zip(g0, g1)]
    reference = [(a + b) / 150 for a, b in zip(g0, g1)]
    expected = (sum((x - y) ** 2 for x, y in zip(averaged, reference)) / sum(y * y for y in reference)) ** 0.5
    assert finding.evidence.gradient_distance == round(expected, 4) and finding.evidence.coordinates == 3
    assert f"{expected:.1%} away from the global batch's (relative L2 over 3 sampled coordinates)" in finding.message


def test_a_sum_divided_by_each_ranks_window_count_is_measured_over_its_targets():
    """Each rank divides its summed token loss by its own window's count (55 and 64 tokens in two
    micro-batches of 25+30 and 32+32): the global batch is the 119 tokens, not the divisors."""
    layout = [[0, 0, 1]]
    sums = {0: (25, 30, 10.0, 20.0), 1: (32, 32, -5.0, 40.0)}
    windows = {}
    for rank, (n1, n2, g1, g2) in sums.items():
        factor = 1 / (n1 + n2)
        windows[rank] = [LossWindow(step=1, backwards=2, grad_layout=layout,
                                    calls=[_call(n1, factor=factor, reduction="sum"),
                                           _call(n2, factor=factor, reduction="sum")],
                                    grad_samples=[[g1 * factor], [(g1 + g2) * factor]])]
    (finding,) = analyze(_job(windows)).findings
    averaged = ((10.0 + 20.0) / 55 + (-5.0 + 40.0) / 64) / 2
    reference = (10.0 + 20.0 - 5.0 + 40.0) / 119
    assert finding.evidence.counts == {"0": [55, 55], "1": [64, 64]}
    assert finding.evidence.gradient_distance == round(abs(averaged - reference) / abs(reference), 4)


def test_accumulated_reads_are_split_into_each_micro_batchs_contribution():
    """Reads accumulate over the window: the second backward's read holds both micro-batches."""
    layout = [[0, 0, 1]]
    one = {0: [LossWindow(step=1, backwards=2, calls=[_call(10, factor=0.5), _call(30, factor=0.5)],
                          grad_layout=layout, grad_samples=[[1.0], [1.0 + 2.0]])],
           1: [LossWindow(step=1, backwards=2, calls=[_call(10, factor=0.5), _call(10, factor=0.5)],
                          grad_layout=layout, grad_samples=[[1.0], [2.0]])]}
    (finding,) = analyze(_job(one)).findings
    # contributions C (factor 0.5 / count): element sums G = C * count / 0.5
    sums = [1.0 * 10 / 0.5, 2.0 * 30 / 0.5, 1.0 * 10 / 0.5, 1.0 * 10 / 0.5]
    averaged = (1.0 + 2.0 + 1.0 + 1.0) / 2
    reference = sum(sums) / 60
    assert finding.evidence.gradient_distance == round(abs(averaged - reference) / abs(reference), 4)
    missing = {r: [LossWindow(step=1, backwards=2, calls=w[0].calls, grad_layout=layout, grad_samples=[[1.0]])]
               for r, w in one.items()}
    assert analyze(_job(missing)).findings[0].evidence.gradient_distance is None
