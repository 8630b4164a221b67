"""optimizer-params on synthetic evidence: copies, replaced parameters, the backstop, and the
patterns that are correct (several optimizers, ZeRO, frozen parameters, lr 0, EMA copies)."""

from __future__ import annotations

from builders import (SCRIPT, config_state, ddp_rewrap, ddp_wrap, fp, init_pg, make_evidence, merge, on_all, optimizer,
                      sharded, site, step, unchanged, usage)

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.optimizer_params import analyze
from ddpdoctor.schema.events import ReplacedParams
from ddpdoctor.schema.fingerprints import encode_fingerprints

MODEL = ("conv.weight", "conv.bias", "fc.weight", "fc.bias")


def run(setup, per_rank=None, world_size=2):
    return analyze(make_evidence(world_size, merge(on_all(world_size, *setup), per_rank or {})))


def trained(iterations=4, unused=None, ddp=0):
    return usage(iterations, unused, ddp=ddp)


def test_the_optimizer_over_a_copy_of_the_model_is_an_error():
    copy = optimizer([f"{n}" for n in MODEL], in_ddp=[False] * 4, built_line=24)
    result = run([ddp_wrap(MODEL, line=22), copy, trained(),
                  step(1, [None] * 4, fp(1, 2, 3, 4)), step(2, [None] * 4, fp(1, 2, 3, 4))])
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.evidence["case"] == "model-not-stepped"
    assert "no optimizer steps the parameters of the DDP model (wrapped at train.py:22)" in finding.message
    assert "steps 4 tensors that the model's forward never uses" in finding.message
    assert "the model's weights never change" in finding.message
    assert finding.location == Location(SCRIPT, 24)
    assert "model.parameters()" in finding.fix


def test_a_head_replaced_after_the_optimizer_was_built_is_named():
    old_head = ["fc.weight", "fc.bias"]
    opt = optimizer(["conv.weight", "conv.bias", *old_head], in_ddp=[True, True, False, False], built_line=23)
    result = run([ddp_wrap(MODEL), opt, trained(), step(1, [[1.0, 1.0], [1.0, 1.0], None, None])])
    (finding,) = result.findings
    assert finding.evidence["case"] == "parameters-not-stepped"
    assert finding.evidence["not_stepped"] == ["fc.weight", "fc.bias"]
    assert "2 parameters of the DDP model get gradients but no optimizer steps them: `fc.weight`, `fc.bias`" \
        in finding.message
    assert "holds 2 tensors that are no longer in the model (shapes [1], [1]): replaced after the optimizer was built" \
        in finding.message
    assert finding.location == Location(SCRIPT, 23)


def test_parameters_added_to_the_model_without_a_stale_copy_are_still_named():
    opt = optimizer(["conv.weight", "conv.bias"])
    (finding,) = run([ddp_wrap(MODEL), opt, trained()]).findings
    assert finding.evidence["not_stepped"] == ["fc.weight", "fc.bias"]
    assert "no longer in the model" not in finding.message


def test_several_optimizers_that_together_cover_the_model_are_correct():
    body = optimizer(["conv.weight", "conv.bias"], opt=0)
    head = optimizer(["fc.weight", "fc.bias"], opt=1)
    assert run([ddp_wrap(MODEL), body, head, trained()]).findings == []


def test_gan_two_models_two_optimizers():
    gen = ddp_wrap(["g.weight"], ddp=0)
    critic = ddp_wrap(["c.weight"], ddp=1)
    opt_g = optimizer(["g.weight"], ddp_of=[0], opt=0)
    opt_d = optimizer(["ddp1:c.weight"], ddp_of=[1], opt=1)
    result = run([gen, critic, opt_g, opt_d, trained(ddp=0), trained(ddp=1)])
    assert result.findings == []
    assert result.summary == "the optimizers step every parameter the DDP models train"


def test_frozen_and_unused_parameters_need_no_optimizer():
    # A parameter frozen before wrapping is not DDP's; one that never gets a gradient needs no step.
    wrap = ddp_wrap(["fc.weight", "fc.bias", "aux.weight"])
    assert run([wrap, optimizer(["fc.weight", "fc.bias"]), trained(4, {2: 4})]).findings == []


def test_a_model_that_never_ran_a_backward_is_not_judged():
    assert run([ddp_wrap(MODEL), optimizer(["conv.weight"])]).findings == []


def test_the_same_module_wrapped_again_counts_once():
    wraps = [ddp_wrap(MODEL, ddp=0), ddp_wrap(MODEL, ddp=1), ddp_rewrap(1, 0)]
    result = run([*wraps, optimizer(MODEL), trained(ddp=0), trained(ddp=1)])
    assert result.findings == []


def test_not_applicable_without_ddp_or_without_optimizer():
    assert not run([optimizer(MODEL, in_ddp=[False] * 4)]).applicable
    assert not run([ddp_wrap(MODEL)]).applicable


# -- the backstop ----------------------------------------------------------------------------------

def stuck_steps(*, lr=0.1, num_steps=6, change=False, grads=1.0, restored=False):
    """Fingerprinted steps of fc.weight (stuck, unless ``change``) and fc.bias (always moving).
    ``restored``: fc.weight moves at each step but is written back to 1.0 before the next."""
    events = []
    for n in range(1, num_steps + 1):
        weight = 1.0 + (0.01 * n if change or restored else 0.0)
        event = step(n, fp(grads, grads), fp(weight, 2.0 + 0.01 * n), config=f"c{n}")
        if restored and n > 1:
            event.written = encode_fingerprints([fp(1.0)[0], None])
        events += [config_state(n, f"c{n}", lr=lr), event]
    return events


def measured(rms: float, ratio, *, num_steps: int = 6, median: float = 1.0) -> list:
    """The rank's measurement of fc.weight (position 0) at every step that left it unchanged."""
    return [unchanged(n, {0: [rms, ratio]}, median=median) for n in range(2, num_steps + 1)]


def test_weights_that_never_change_without_a_measured_reason_are_an_info_not_a_guess():
    # Evidence of an optimizer whose rule ddpdoctor does not know (ratio None), or of an older build.
    for extra in ([], measured(0.1, None)):
        events = stuck_steps() + extra
        (finding,) = run([ddp_wrap(), optimizer(built_line=31), trained()], {0: events, 1: events}).findings
        assert finding.severity == "info"
        assert finding.evidence["case"] == "weights-never-change"
        assert finding.evidence["parameters"] == ["fc.weight"]
        assert finding.evidence["steps"] == [2, 3, 4, 5, 6]
        assert "at 5 fingerprinted steps in a row (2-6)" in finding.message
        assert "cannot tell" in finding.message
        assert finding.location == Location(SCRIPT, 31)


def test_an_update_that_should_have_moved_the_weights_is_still_only_an_info():
    events = stuck_steps() + measured(0.1, 40.0)
    (finding,) = run([ddp_wrap(), optimizer(), trained()], {0: events, 1: events}).findings
    assert finding.severity == "info" and "should have moved them" in finding.message


def test_a_negligible_gradient_is_no_evidence():
    # A conv bias before BatchNorm: its gradient is zero but for rounding, 1e-7 of the others'.
    events = stuck_steps() + measured(1e-9, 1e-4, median=1e-2)
    assert run([ddp_wrap(), optimizer(), trained()], {0: events, 1: events}).findings == []


def test_updates_below_the_weights_precision_are_a_warning_naming_the_parameters():
    opt = optimizer(dtypes=["torch.bfloat16", "torch.bfloat16"])
    events = stuck_steps() + measured(0.05, 0.08)
    result = run([ddp_wrap(), opt, trained()], {0: events, 1: events})
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.evidence["case"] == "updates-below-precision"
    assert finding.evidence["parameters"] == ["fc.weight"]
    assert finding.evidence["largest_update_to_spacing"] == 0.08
    assert "bfloat16" in finding.message and "no DDP fault" in finding.message
    assert "float32 master weights" in finding.fix and "autocast" in finding.fix
    assert result.summary == "the weights of `fc.weight` never change despite gradients"


def test_float32_updates_below_precision_with_a_real_gradient_suggest_the_learning_rate():
    events = stuck_steps() + measured(0.5, 0.3)  # a gradient half the median's: the lr is far too small
    (finding,) = run([ddp_wrap(), optimizer(), trained()], {0: events, 1: events}).findings
    assert finding.severity == "warning" and "float32 weights" in finding.message
    assert "learning rate" in finding.fix


def test_a_float32_weight_with_a_small_gradient_whose_update_rounds_away_is_no_finding():
    """A conv bias before BatchNorm over 28x28 maps: its gradient is zero but for float32 rounding summed
    over 78,400 terms, about 1e-2 of the others', and its SGD update at lr 1e-4 below its spacing."""
    events = stuck_steps() + measured(0.01, 0.2)
    assert run([ddp_wrap(), optimizer(), trained()], {0: events, 1: events}).findings == []


def test_weights_written_back_before_every_step_are_an_error_that_says_so():
    result = run([ddp_wrap(), optimizer(built_line=31), trained()],
                 {0: stuck_steps(restored=True, num_steps=7), 1: stuck_steps(restored=True, num_steps=7)})
    (finding,) = result.findings
    assert finding.evidence["case"] == "weights-restored"
    assert finding.evidence["steps"] == [3, 4, 5, 6, 7]
    assert "writes the same values back into it before each step" in finding.message
    assert "load_state_dict" in finding.message
    assert finding.severity == "error"
    assert result.summary == "the weights of `fc.weight` never change despite gradients"


def test_weights_written_between_steps_to_new_values_are_fine():
    # Clamping or renormalizing after each step writes the weights, but not back to the same values.
    events = stuck_steps(change=True, num_steps=7)
    for n, event in enumerate(e for e in events if e.kind == "step"):
        event.written = encode_fingerprints([fp(1.0 + 0.001 * n)[0], None])
    assert run([ddp_wrap(), optimizer(), trained()], {0: events, 1: events}).findings == []


def test_weights_that_change_are_fine():
    setup = [ddp_wrap(), optimizer(), trained()]
    assert run(setup, {0: stuck_steps(change=True), 1: stuck_steps(change=True)}).findings == []


def test_a_param_group_with_lr_zero_is_a_deliberate_freeze():
    setup = [ddp_wrap(), optimizer(), trained()]
    assert run(setup, {0: stuck_steps(lr=0.0), 1: stuck_steps(lr=0.0)}).findings == []


def test_fewer_stuck_steps_than_the_threshold_are_not_reported():
    setup = [ddp_wrap(), optimizer(), trained()]
    assert run(setup, {0: stuck_steps(num_steps=5), 1: stuck_steps(num_steps=5)}).findings == []


# -- models no optimizer steps ----------------------------------------------------------------------

def test_models_no_optimizer_holds_are_one_info_per_line_not_an_error_each():
    """A test script that builds a DDP model per case and compares gradients without an optimizer:
    nothing shows the models were meant to be stepped (no stale copy in any optimizer)."""
    models = [ddp_wrap(MODEL, ddp=d, line=74) for d in range(3)]
    other = optimizer(["a", "b"], in_ddp=[False, False])  # the script's own reference model's optimizer
    steps = [step(1, fp(1, 2), fp(1, 2)), step(2, fp(1, 2), fp(3, 4))]
    result = run([*models, other, *[trained(ddp=d) for d in range(3)], *steps])
    (finding,) = result.findings
    assert finding.severity == "info" and finding.evidence["case"] == "model-not-stepped"
    assert finding.evidence["models"] == 3
    assert "the 3 DDP models (wrapped at train.py:74)" in finding.message
    assert finding.location == Location(SCRIPT, 74)  # the models, not an unrelated optimizer


# -- FSDP2: an optimizer built before fully_shard ------------------------------------------------

def _replaced(positions, names, lines=(25,), opt=0):
    return ReplacedParams(opt=opt, api="fully_shard", positions=list(positions), names=list(names),
                          shapes=[[1] for _ in names], sites=[site(line) for line in lines])


def _fsdp2(*events, names=MODEL):
    """Two ranks that shard the model with fully_shard (line 25, no DDP module) and step an optimizer
    built at line 23 over ``names``."""
    return run([init_pg(2), sharded(line=25), optimizer(names, in_ddp=[False] * len(names), built_line=23,
                                                         type_name="AdamW"),
                *events, step(1, [None] * len(names), fp(*range(len(names))))])


def test_an_optimizer_built_before_fully_shard_is_an_error_at_its_line_naming_the_shard_call():
    result = _fsdp2(_replaced(range(4), MODEL, lines=(25, 26)))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 23)
    assert finding.evidence["case"] == "replaced-by-sharding"
    assert finding.evidence["replaced"] == list(MODEL)
    assert finding.evidence["sharded_at"] == [{"file": SCRIPT, "line": 25}, {"file": SCRIPT, "line": 26}]
    assert ("optimizer 0 (AdamW, built at train.py:23) was built before `fully_shard` (at train.py:25 and train.py:26) "
            "and steps the model's old parameters: all 4 of its tensors (`conv.weight`, `conv.bias`, `fc.weight`, "
            "`fc.bias`) were replaced by `fully_shard`") in finding.message
    assert finding.message.endswith("the model never trains")
    assert "after the last `fully_shard`, from `model.parameters()`" in finding.fix
    assert result.summary == "the optimizers step tensors that `fully_shard` replaced (ranks 0, 1)"


def test_some_tensors_replaced_are_those_parameters_that_never_train():
    (finding,) = _fsdp2(_replaced([2, 3], ["fc.weight", "fc.bias"])).findings
    assert "2 of its 4 tensors (`fc.weight`, `fc.bias`)" in finding.message
    assert finding.message.endswith("these parameters never train")


def test_an_optimizer_built_after_fully_shard_keeps_the_sharded_skip():
    result = _fsdp2()
    assert result.findings == []
    assert result.status == "skip"
    assert "does not check sharded models yet" in result.summary


def test_the_replaced_tensors_are_judged_per_rank_and_the_finding_names_the_ranks():
    events = merge(on_all(2, init_pg(2), sharded(line=25), optimizer(MODEL, in_ddp=[False] * 4, built_line=23)),
                   {1: [_replaced(range(4), MODEL)]})
    (finding,) = analyze(make_evidence(2, events)).findings
    assert finding.ranks == (1,)
