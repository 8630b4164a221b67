"""unused-parameters: parameters without gradient, and whether find_unused_parameters fits."""

from __future__ import annotations

from builders import SCRIPT, ddp_wrap, exception, make_evidence, merge, on_all, step, usage

from ddpdoctor.analysis.api import Location
from ddpdoctor.analysis.facts.failures import REDUCTION_ERRORS
from ddpdoctor.checks.unused_parameters import analyze

REDUCTION_ERROR = REDUCTION_ERRORS[0]
LIGHTNING_ERROR = ("It looks like your LightningModule has parameters that were not used in producing the loss "
                   "returned by training_step. If this is intentional, you must enable the detection of unused "
                   "parameters in DDP, either by setting the string value `strategy='ddp_find_unused_parameters_true'`")

PARAMS = ("body.weight", "body.bias", "aux_head.weight")


def usage_of(iterations_unused, ddp=0):
    """Usage totals of one rank from its iterations: each a list of unused indices (None: no backward)."""
    counted = [u for u in iterations_unused if u is not None]
    counts = {}
    for unused in counted:
        for i in unused:
            counts[i] = counts.get(i, 0) + 1
    return usage(len(counted), counts, ddp=ddp)


def evidence(iterations_by_rank, *, world_size=2, extra=None, **wrap):
    """iterations_by_rank: {rank: [unused list or None per iteration]}."""
    usages = {r: [usage_of(ws)] for r, ws in iterations_by_rank.items()}
    return make_evidence(world_size, merge(on_all(world_size, ddp_wrap(PARAMS, **wrap)), usages, extra or {}))


def test_unused_parameter_without_find_unused_is_an_error_naming_it():
    result = analyze(evidence({0: [[2], [2]], 1: [[2], [2]]}))
    (finding,) = result.findings
    assert finding.check == "unused-parameters"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 20)
    assert finding.message == "`aux_head.weight` got no gradient but DDP was built with find_unused_parameters=False"
    assert finding.evidence["unused"] == ["aux_head.weight"]
    assert finding.evidence["iterations_without_grad"] == {"aux_head.weight": {"0": 2, "1": 2}}
    assert result.status == "fail"


def test_reduction_crash_is_named_with_the_crashed_ranks():
    crash = exception("RuntimeError", f"{REDUCTION_ERROR} before starting a new one. parameter indices: 2")
    result = analyze(evidence({0: [[2]], 1: [[2]]}, extra={0: [crash], 1: [crash]}))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert f"DDP then raised \"{REDUCTION_ERROR}\" on ranks 0, 1" in finding.message
    assert finding.evidence["crashed_ranks"] == [0, 1]


def test_reduction_crash_before_any_window_still_reports_the_crashed_rank():
    crash = exception("RuntimeError", f"{REDUCTION_ERROR} before starting a new one.")
    result = analyze(evidence({}, extra={1: [crash]}))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.ranks == (1,)
    assert finding.message.startswith("some parameters got no gradient")


def test_unused_only_on_one_rank_without_find_unused_names_that_rank():
    result = analyze(evidence({0: [[], []], 1: [[], [0, 1]]}))
    (finding,) = result.findings
    assert finding.ranks == (1,)
    assert finding.evidence["unused"] == ["body.weight", "body.bias"]


def test_needless_find_unused_parameters_is_a_warning():
    result = analyze(evidence({0: [[], [], []], 1: [[], [], []]}, find_unused_parameters=True))
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.message.startswith("find_unused_parameters=True but every parameter got a gradient in every "
                                      "observed iteration (6 rank-iterations)")
    assert finding.evidence["iterations_observed"] == {"0": 3, "1": 3}
    assert result.status == "warn"


def test_parameter_never_used_anywhere_with_find_unused_is_a_dead_weight_warning():
    result = analyze(evidence({0: [[2], [2]], 1: [[2], [2]]}, find_unused_parameters=True))
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.message == "`aux_head.weight` never got a gradient on any rank"
    assert finding.evidence["never_used"] == ["aux_head.weight"]


def test_parameter_unused_on_some_steps_with_find_unused_is_info():
    result = analyze(evidence({0: [[2], []], 1: [[], [2]]}, find_unused_parameters=True))
    (finding,) = result.findings
    assert finding.severity == "info"
    assert "`aux_head.weight` got no gradient on some iterations or ranks only" in finding.message
    assert finding.evidence["iterations_without_grad"] == {"aux_head.weight": {"0": 1, "1": 1}}
    assert result.status == "pass"


def test_static_graph_tolerates_unused_parameters():
    result = analyze(evidence({0: [[2]], 1: [[2]]}, static_graph=True))
    assert result.findings == []
    assert result.status == "pass"


def test_every_parameter_used_without_find_unused_is_clean():
    result = analyze(evidence({0: [[], []], 1: [[], []]}))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "every parameter got a gradient (4 rank-iterations observed)"


def test_iterations_without_backward_are_not_counted():
    result = analyze(evidence({0: [None], 1: [None]}))
    assert result.findings == []
    assert result.status == "skip"


def test_no_ddp_module_is_skipped():
    result = analyze(make_evidence(2, [step(1)]))
    assert result.status == "skip"
    assert result.summary == "no DDP module"


def test_lightning_rewording_of_the_reduction_error_counts_as_the_crash():
    crash = exception("RuntimeError", LIGHTNING_ERROR)
    (finding,) = analyze(evidence({0: [[2]], 1: [[2]]}, extra={0: [crash], 1: [crash]})).findings
    assert finding.evidence["crashed_ranks"] == [0, 1]
    assert finding.evidence["unused"] == ["aux_head.weight"]


def test_two_ddp_models_are_judged_each_on_its_own_iterations():
    # A GAN: generator (ddp 0) and critic (ddp 1), each with its own optimizer; every parameter of
    # each got a gradient in each of its own iterations.
    setup = on_all(2, ddp_wrap(["g.w", "g.b"], ddp=0), ddp_wrap(["d.w", "d.b"], ddp=1, line=21))
    usages = on_all(2, usage(5, ddp=0), usage(10, ddp=1))
    result = analyze(make_evidence(2, merge(setup, usages)))
    assert result.findings == []
    assert result.summary == "every parameter got a gradient (30 rank-iterations observed)"


def test_the_latest_cumulative_usage_of_a_rank_wins():
    events = on_all(2, ddp_wrap(PARAMS), usage(1, {2: 1}, last_unused=[2], final=False), usage(4, {2: 1}))
    (finding,) = analyze(make_evidence(2, events)).findings
    assert finding.evidence["iterations_without_grad"] == {"aux_head.weight": {"0": 1, "1": 1}}
