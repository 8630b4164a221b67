"""gradient-sync on synthetic evidence: every case id, the first divergence, known-good patterns."""

from __future__ import annotations

from builders import (SCRIPT, comm_hook, ddp_bypass, ddp_rewrap, ddp_wrap, forwards, fp, init_pg, make_evidence,
                      merge, module_conversion, on_all, optimizer, process_start, step, usage)

from ddpdoctor.schema.events import DeviceSimulation

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks import gradient_sync
from ddpdoctor.checks.gradient_sync import analyze

NAMES = ("fc.weight", "fc.bias")


def run(world_size, setup, steps_by_rank):
    """setup: events on every rank before training; steps_by_rank: {rank: [step events]}."""
    return analyze(make_evidence(world_size, merge(on_all(world_size, *setup), steps_by_rank)))


def only_finding(result):
    assert len(result.findings) == 1, result.findings
    return result.findings[0]


def assert_divergence(finding, *, case, step_n, parameter, compared="grads", ranks=(0, 1)):
    assert finding.check == "gradient-sync"
    assert finding.severity == "error"
    assert finding.ranks == ranks
    assert finding.evidence["case"] == case
    assert finding.evidence["step"] == step_n
    assert finding.evidence["parameter"] == parameter
    assert finding.evidence["compared"] == compared
    assert f"`{parameter}`" in finding.message
    assert f"optimizer step {step_n}" in finding.message
    assert finding.location == Location(SCRIPT, 30)  # the optimizer's construction site


# -- the check fires --------------------------------------------------------------------------------

def test_not_wrapped_when_no_ddp_wrap_event():
    result = run(2, [optimizer(NAMES, in_ddp=[False, False])], {
        0: [step(1, fp(1.0, 2.0))],
        1: [step(1, fp(1.5, 2.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="not-wrapped", step_n=1, parameter="fc.weight")
    assert "not wrapped in DistributedDataParallel" in finding.message
    assert "DistributedDataParallel(model)" in finding.fix
    assert finding.evidence["rank_groups"] == [[0], [1]]
    assert finding.evidence["fingerprints"] == {"0": fp(1.0)[0], "1": fp(1.5)[0]}
    assert finding.evidence["relative_difference"] is None  # word sums say the bits differ, not by how much
    assert result.status == "fail"
    assert "step 1" in result.summary


def test_outside_ddp_parameter_not_in_the_wrapped_module():
    result = run(2, [ddp_wrap(["fc.weight"]), optimizer(["fc.weight", "extra.scale"], in_ddp=[True, False])], {
        0: [step(1, fp(1.0, 3.0))],
        1: [step(1, fp(1.0, 4.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="outside-ddp", step_n=1, parameter="extra.scale")
    assert "not part of any DDP-wrapped module" in finding.message


def test_step_in_no_sync_when_every_backward_of_the_window_ran_under_no_sync():
    no_sync_only = {"0": forwards(synced=0, unsynced=2)}
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, fp(1.0, 2.0), ddp=no_sync_only)],
        1: [step(1, fp(-1.0, 2.0), ddp=no_sync_only)],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="step-in-no-sync", step_n=1, parameter="fc.weight")
    assert "no_sync()" in finding.message


def test_ddp_bypassed_when_the_inner_module_ran_without_the_wrapper():
    bypass = {"0": forwards(synced=0, unsynced=0, inner=1)}
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, fp(1.0, 2.0), ddp=bypass)],
        1: [step(1, fp(1.0, 2.5), ddp=bypass)],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="ddp-bypassed", step_n=1, parameter="fc.bias")
    assert "model.module(" in finding.message


def test_modified_after_backward_when_ddp_synchronized_the_backward():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, fp(1.0, 2.0))],
        1: [step(1, fp(0.5, 2.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="modified-after-backward", step_n=1, parameter="fc.weight")
    assert "changed afterwards" in finding.message


def test_reduction_incomplete_when_a_parameter_got_no_gradient_without_find_unused():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), usage(1, {1: 1}, last_unused=[1])], {
        0: [step(1, fp(1.0, 2.0))],
        1: [step(1, fp(3.0, 2.0))],
    })
    assert only_finding(result).evidence["case"] == "reduction-incomplete"


def test_params_modified_when_gradients_match_but_parameters_differ():
    grads = fp(1.0, 2.0)
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, grads, fp(5.0, 6.0)), step(2, grads, fp(5.0, 6.0))],
        1: [step(1, grads, fp(5.0, 6.0)), step(2, grads, fp(5.0, 7.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="params-modified", step_n=2, parameter="fc.bias", compared="params")
    assert "gradients were identical" in finding.message
    assert result.status == "fail"


def test_first_divergent_step_is_reported_when_several_differ():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, fp(1.0, 2.0)), step(2, fp(1.0, 2.0)), step(3, fp(1.0, 2.0)), step(4, fp(1.0, 2.0))],
        1: [step(1, fp(1.0, 2.0)), step(2, fp(1.0, 2.0)), step(3, fp(1.0, 9.0)), step(4, fp(7.0, 9.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["step"] == 3
    assert finding.evidence["parameter"] == "fc.bias"


def test_first_divergent_step_found_even_when_rank_events_are_out_of_step_order():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(5, fp(1.0, 2.0)), step(2, fp(1.0, 2.0))],
        1: [step(5, fp(9.0, 2.0)), step(2, fp(1.0, 8.0))],
    })
    assert only_finding(result).evidence["step"] == 2


def test_gradients_are_compared_before_parameters_of_the_same_step():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, fp(1.0, 2.0), fp(1.0, 2.0))],
        1: [step(1, fp(1.0, 3.0), fp(4.0, 2.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["compared"] == "grads"
    assert finding.evidence["parameter"] == "fc.bias"


def test_odd_rank_out_of_majority_is_grouped_apart():
    grads = {r: [step(1, fp(1.0, 2.0))] for r in range(4)}
    grads[2] = [step(1, fp(1.0, 2.0 + 1e-3))]
    finding = only_finding(run(4, [ddp_wrap(NAMES), optimizer(NAMES)], grads))
    assert finding.ranks == (0, 1, 2, 3)
    assert finding.evidence["rank_groups"] == [[0, 1, 3], [2]]
    assert finding.evidence["parameter"] == "fc.bias"


def test_missing_gradient_on_one_rank_differs_from_a_present_one():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {
        0: [step(1, [[1.0, 2.0], None])],
        1: [step(1, [[1.0, 2.0], [0.5, 1.5]])],
    })
    assert only_finding(result).evidence["parameter"] == "fc.bias"


def test_window_of_the_module_owning_the_parameter_decides_the_case():
    # Two DDP modules (a GAN): the generator's forwards since the critic's step say nothing about
    # the critic's own parameters, which were stepped inside no_sync.
    setup = [ddp_wrap(["g.w"], ddp=0), ddp_wrap(["d.w"], ddp=1), optimizer(["g.w"], opt=0, ddp_of=[0]),
             optimizer(["d.w"], opt=1, ddp_of=[1])]
    windows = {"0": forwards(synced=2), "1": forwards(synced=0, unsynced=1)}
    result = run(2, setup, {
        0: [step(1, fp(1.0), opt=1, ddp=windows)],
        1: [step(1, fp(2.0), opt=1, ddp=windows)],
    })
    assert only_finding(result).evidence["case"] == "step-in-no-sync"


def test_second_optimizer_names_come_from_its_own_optimizer_event():
    setup = [ddp_wrap(["a.w", "b.w"]), optimizer(["a.w"], opt=0), optimizer(["b.w"], opt=1)]
    result = run(2, setup, {
        0: [step(1, fp(1.0), opt=0), step(1, fp(2.0), opt=1)],
        1: [step(1, fp(1.0), opt=0), step(1, fp(3.0), opt=1)],
    })
    finding = only_finding(result)
    assert finding.evidence["optimizer"] == 1
    assert finding.evidence["parameter"] == "b.w"


def test_nan_gradient_on_one_rank_only_is_a_divergence():
    result = run(2, [optimizer(NAMES, in_ddp=[False, False])], {
        0: [step(1, fp(1.0, 2.0))],
        1: [step(1, fp(float("nan"), 2.0))],
    })
    assert only_finding(result).evidence["case"] == "not-wrapped"


# -- the cause, when the evidence holds it ----------------------------------------------------------

def test_bypass_points_at_the_bypassing_forward_not_the_step():
    bypass = {"0": forwards(synced=0, unsynced=0, inner=1)}
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), ddp_bypass(line=66)], {
        0: [step(1, fp(1.0, 2.0), ddp=bypass)],
        1: [step(1, fp(1.0, 2.5), ddp=bypass)],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "ddp-bypassed"
    assert finding.location == Location(SCRIPT, 66)


def test_conversion_of_the_wrapped_model_after_wrapping_is_named_with_its_lines():
    conversions = [module_conversion("to", "torch.bfloat16", line=29, step_=4, t=1.0),
                   module_conversion("float", "torch.float32", line=32, step_=4, t=2.0)]
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), *conversions], {
        0: [step(5, fp(1.0, 2.0), touched=0)],
        1: [step(5, fp(1.5, 2.0), touched=0)],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "converted-after-wrap"
    assert "`.to(torch.bfloat16)` at train.py:29 and `.float()` at train.py:32" in finding.message
    assert "DDP's gradient hooks and buckets still point at the old tensors" in finding.message
    assert finding.location == Location(SCRIPT, 29)
    assert "clip" not in finding.fix and "before wrapping" in finding.fix


def test_a_conversion_after_the_divergence_does_not_explain_it():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), module_conversion("half", "torch.float16", step_=9)], {
        0: [step(5, fp(1.0, 2.0))],
        1: [step(5, fp(1.5, 2.0))],
    })
    assert only_finding(result).evidence["case"] == "modified-after-backward"


def test_ddp_constructed_again_with_a_bare_forward_names_both_lines():
    wraps = [ddp_wrap(NAMES, ddp=0, line=17), ddp_wrap(NAMES, ddp=1, line=17), ddp_rewrap(1, 0), ddp_bypass(line=81)]
    bypass = {"0": forwards(synced=0, unsynced=0, inner=1)}
    result = run(2, [*wraps, optimizer(NAMES)], {0: [step(2, fp(1.0, 2.0), ddp=bypass)],
                                                1: [step(2, fp(1.2, 2.0), ddp=bypass)]})
    finding = only_finding(result)
    assert finding.evidence["case"] == "ddp-rewrapped"
    assert "constructed again around a module DDP already wraps" in finding.message
    assert "train.py:17" in finding.message and "the bare module (at train.py:81)" in finding.message
    assert finding.location == Location(SCRIPT, 81)
    assert finding.evidence["first_wrap"] == {"file": SCRIPT, "line": 17}


def test_a_rewrap_alone_does_not_hide_another_cause():
    wraps = [ddp_wrap(NAMES, ddp=0), ddp_wrap(NAMES, ddp=1), ddp_rewrap(1, 0)]
    result = run(2, [*wraps, optimizer(NAMES)], {0: [step(2, fp(1.0, 2.0))], 1: [step(2, fp(1.2, 2.0))]})
    assert only_finding(result).evidence["case"] == "modified-after-backward"


def test_gradients_that_differ_out_of_the_all_reduce_name_the_comm_hook():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook("flaky_allreduce", line=36)], {
        0: [step(3, fp(1.0, 2.0), touched=0)],
        1: [step(3, fp(1.001, 2.0), touched=0)],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "comm-hook"
    assert "`flaky_allreduce` (registered at train.py:36)" in finding.message
    assert "already differ as they come out of DDP's all-reduce" in finding.message
    assert finding.location == Location(SCRIPT, 36)
    assert "clip" not in finding.fix.lower()


def test_without_a_hook_the_interconnect_is_named_and_the_reference_job_offered():
    result = run(2, [init_pg(backend="nccl"), ddp_wrap(NAMES, line=21), optimizer(NAMES)], {
        0: [step(3, fp(1.0, 2.0), touched=0)],
        1: [step(3, fp(1.001, 2.0), touched=0)],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "all-reduce-differs"
    assert "interconnect" in finding.message and "(nccl)" in finding.message
    assert "reference job" in finding.fix and "clip" not in finding.fix.lower()
    assert finding.location == Location(SCRIPT, 21)


def test_reduced_gradients_equal_but_changed_afterwards_on_one_rank_is_a_modification():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(3, fp(1.0, 2.0), touched=0)],
        1: [step(3, fp(0.5, 2.0), touched=2, reduced=fp(1.0, 2.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "modified-after-backward"
    assert "rank 1 changed gradients between the end of DDP's all-reduce and the step" in finding.message
    assert finding.evidence["changed_after_all_reduce"] == {"1": 2}


def test_sampled_snapshots_that_differ_across_ranks_name_the_comm_hook():
    """Every rank records the sampled fingerprints of the reduced gradients (new evidence): they are
    compared with each other, never with the full fingerprints before the step."""
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook("flaky_allreduce", line=36)], {
        0: [step(3, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(3, fp(1.001, 2.0), touched=0, reduced=fp(7.5, 8.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "comm-hook"


def test_equal_sampled_snapshots_and_a_change_on_one_rank_is_a_modification():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(3, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(3, fp(0.5, 2.0), touched=1, reduced=fp(7.0, 8.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "modified-after-backward"
    assert finding.evidence["changed_after_all_reduce"] == {"1": 1}


def test_a_rank_without_its_sampled_snapshot_is_never_compared_with_full_values():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(3, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(3, fp(1.001, 2.0), touched=0)],
    })
    assert only_finding(result).evidence["case"] == "modified-after-backward"


def test_reduced_gradients_unknown_on_a_rank_keep_the_generic_case():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(3, fp(1.0, 2.0), touched=0)],
        1: [step(3, fp(1.001, 2.0))],
    })
    assert only_finding(result).evidence["case"] == "modified-after-backward"


def test_a_cause_not_seen_at_the_first_divergent_step_is_taken_from_the_next_step_that_saw_it():
    """--fingerprint-every 1: step 37 diverges first, and only step 40 (the automatic schedule's)
    took DDP's all-reduce snapshot; the gradients still differ there, as they came out of it."""
    result = run(2, [init_pg(backend="nccl"), ddp_wrap(NAMES, line=21), optimizer(NAMES)], {
        0: [step(36, fp(1.0, 2.0)), step(37, fp(1.0, 2.0)), step(38, fp(1.0, 2.0)),
            step(40, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(36, fp(1.0, 2.0)), step(37, fp(1.001, 2.0)), step(38, fp(1.001, 2.0)),
            step(40, fp(1.001, 2.0), touched=0, reduced=fp(7.5, 8.0))],
    })
    finding = only_finding(result)
    assert (finding.severity, finding.evidence["case"], finding.evidence["step"]) == ("error", "all-reduce-differs", 37)
    assert "gradients of `fc.weight` differ across ranks at optimizer step 37" in finding.message
    assert finding.location == Location(SCRIPT, 21)  # the wrap: the all-reduce DDP runs
    assert finding.evidence["cause_step"] == 40
    assert finding.evidence["last_identical_step"] == 36
    assert "(seen at optimizer step 40, the first step after 37 with DDP's all-reduce snapshot" in finding.message


def test_a_borrowed_cause_names_the_ranks_that_changed_gradients_at_that_step():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(37, fp(1.0, 2.0)), step(40, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(37, fp(0.5, 2.0)), step(40, fp(0.5, 2.0), touched=1, reduced=fp(7.0, 8.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="modified-after-backward", step_n=37, parameter="fc.weight")
    assert finding.evidence["changed_after_all_reduce"] == {"1": 1}
    assert finding.evidence["cause_step"] == 40


def test_a_gradient_equal_again_at_the_next_explained_step_keeps_its_cause_unseen():
    """A fault of step 37 alone: at step 40 the gradients agree (the all-reduce averaged them), so
    step 40's snapshot says nothing about step 37, even though a later step differs again."""
    result = run(2, [init_pg(backend="nccl"), ddp_wrap(NAMES), optimizer(NAMES), comm_hook()], {
        0: [step(37, fp(1.0, 2.0)), step(40, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0), params=[[3.0], [1.0]]),
            step(60, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0))],
        1: [step(37, fp(1.001, 2.0)), step(40, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0), params=[[4.0], [1.0]]),
            step(60, fp(1.001, 2.0), touched=0, reduced=fp(7.5, 8.0))],
    })
    finding = only_finding(result)
    assert_divergence(finding, case="modified-after-backward", step_n=37, parameter="fc.weight")
    assert "cause_step" not in finding.evidence
    assert "changed_after_all_reduce" not in finding.evidence
    assert "seen at optimizer step" not in finding.message


def test_a_divergent_step_with_its_own_snapshot_borrows_nothing():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES), comm_hook("flaky_allreduce", line=36)], {
        0: [step(3, fp(1.0, 2.0), touched=0, reduced=fp(7.0, 8.0)), step(4, fp(1.0, 2.0), touched=1,
                                                                          reduced=fp(7.0, 8.0))],
        1: [step(3, fp(1.001, 2.0), touched=0, reduced=fp(7.5, 8.0)), step(4, fp(0.5, 2.0), touched=0,
                                                                            reduced=fp(7.0, 8.0))],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "comm-hook"
    assert "cause_step" not in finding.evidence


def test_a_device_round_trip_under_the_cuda_simulation_is_the_gpu_bug_it_is():
    moves = [module_conversion("cpu", "cpu", swapped=False, device_move=True, line=36, t=1.0),
             module_conversion("cuda", "cuda", swapped=False, device_move=True, line=39, t=2.0)]
    steps = [step(n, fp(1.0, 2.0), t=float(n + 1)) for n in (1, 2)]  # step 2 trains after the move back
    result = run(2, [DeviceSimulation(active=True), ddp_wrap(NAMES), optimizer(NAMES), *moves], {0: steps, 1: steps})
    finding = only_finding(result)
    assert finding.evidence["case"] == "device-round-trip"
    assert "`.cpu()` at train.py:36, then `.cuda()` at train.py:39" in finding.message
    assert "CUDA simulation" in finding.message
    assert finding.location == Location(SCRIPT, 36)


def test_a_round_trip_after_training_ended_is_nothing():
    """Lightning moves the model off the GPU when `fit` ends and back for `test`: no training follows."""
    moves = [module_conversion("cpu", "cpu", swapped=False, device_move=True, line=36, t=5.0),
             module_conversion("cuda", "cuda", swapped=False, device_move=True, line=39, t=6.0)]
    steps = [step(n, fp(1.0, 2.0), t=float(n)) for n in (1, 2)]
    assert run(2, [DeviceSimulation(active=True), ddp_wrap(NAMES), optimizer(NAMES), *moves],
               {0: steps, 1: steps}).findings == []


def test_a_cpu_call_on_a_cpu_model_without_simulation_is_nothing():
    moves = [module_conversion("cpu", "cpu", swapped=False, device_move=True, t=1.0),
             module_conversion("to", "cpu", swapped=False, device_move=True, t=2.0)]
    steps = [step(n, fp(1.0, 2.0)) for n in (1, 2)]
    assert run(2, [ddp_wrap(NAMES), optimizer(NAMES), *moves], {0: steps, 1: steps}).findings == []
    assert run(2, [DeviceSimulation(active=True), ddp_wrap(NAMES), optimizer(NAMES), moves[0]],
               {0: steps, 1: steps}).findings == []


# -- the check stays silent -------------------------------------------------------------------------

def test_no_sync_gradient_accumulation_stepping_after_a_synced_forward_is_clean():
    accumulate = {"0": forwards(synced=1, unsynced=3)}
    steps = [step(n, fp(1.0 * n, 2.0), fp(3.0 * n, 4.0), ddp=accumulate) for n in (1, 2, 3)]
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {0: steps, 1: steps})
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "replicas identical after 3 compared steps"


def test_fingerprints_equal_within_1e9_relative_are_identical():
    rank0 = [step(1, [[1234.5678, 99.0], [-0.25, 3.0]], [[10.0, 11.0], [12.0, 13.0]])]
    rank1 = [step(1, [[1234.5678 * (1 + 1e-9), 99.0 * (1 - 1e-9)], [-0.25 * (1 + 1e-9), 3.0]],
                  [[10.0 * (1 + 1e-9), 11.0], [12.0, 13.0 * (1 - 1e-9)]])]
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {0: rank0, 1: rank1})
    assert result.findings == []
    assert result.status == "pass"


def test_rank_seeded_init_then_ddp_is_clean_because_ddp_broadcasts_rank0_weights():
    # Each rank seeded its own init, but DDP's constructor broadcast rank 0's weights: after the
    # first step every replica holds the same parameters.
    steps = [step(n, fp(0.1 * n, 0.2), fp(1.0 - 0.1 * n, 2.0)) for n in (1, 2)]
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {0: steps, 1: steps})
    assert result.status == "pass"
    assert result.findings == []


def test_sampling_interval_is_named_in_the_summary():
    steps = [step(1, fp(1.0, 2.0)), step(2), step(3), step(4), step(5, fp(1.0, 2.0))]
    result = run(2, [process_start(fingerprint_every=4), ddp_wrap(NAMES), optimizer(NAMES)], {0: steps, 1: steps})
    assert result.findings == []
    assert result.summary == "replicas identical after 2 compared steps (fingerprinted every 4 steps)"


# -- not applicable ---------------------------------------------------------------------------------

def test_single_process_is_skipped():
    result = analyze(make_evidence(1, [ddp_wrap(NAMES), optimizer(NAMES), step(1, fp(1.0, 2.0))]))
    assert result.status == "skip"
    assert result.findings == []


def test_no_step_event_is_skipped():
    result = analyze(make_evidence(2, [ddp_wrap(NAMES), optimizer(NAMES)]))
    assert result.status == "skip"
    assert result.summary == "no optimizer step observed"


def test_steps_seen_on_one_rank_only_are_skipped():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {0: [step(1, fp(1.0, 2.0))], 1: []})
    assert result.status == "skip"
    assert result.summary == "no optimizer step was seen on two ranks"


def test_steps_without_fingerprints_are_skipped():
    result = run(2, [ddp_wrap(NAMES), optimizer(NAMES)], {0: [step(1)], 1: [step(1)]})
    assert result.status == "skip"


def test_check_object():
    assert gradient_sync.CHECK.id == "gradient-sync"
    assert gradient_sync.CHECK.analyze is analyze


def test_a_parameter_frozen_when_ddp_was_built_and_unfrozen_later_names_both_lines():
    from ddpdoctor.schema.events import Unfrozen

    info = optimizer(NAMES, in_ddp=[True, False])
    info.frozen_in = [None, 0]
    unfreeze = Unfrozen(ddp=0, names=["fc.bias"], call="requires_grad_",
                        site=[{"file": SCRIPT, "line": 55, "function": "main"}])
    result = run(2, [ddp_wrap(["fc.weight"], line=40), info, unfreeze], {
        0: [step(1, fp(1.0, 2.0))],
        1: [step(1, fp(1.0, 2.5))],
    })
    finding = only_finding(result)
    assert finding.evidence["case"] == "frozen-at-wrap"
    assert finding.evidence["parameter"] == "fc.bias"
    assert "frozen (requires_grad=False) when DistributedDataParallel was built (at train.py:40)" in finding.message
    assert "made trainable later (`requires_grad_` at train.py:55)" in finding.message
    assert finding.location == Location(SCRIPT, 55)
    assert finding.evidence["wrapped_at"]["line"] == 40
    assert "Freeze after wrapping" in finding.fix


def test_local_steps_that_the_script_averages_back_are_local_sgd_info_not_an_error():
    """Local steps inside no_sync, then every 2 steps an all-reduce of each parameter (Accelerate's
    LocalSGD, torch's PeriodicModelAverager): the replicas differ between averagings by design."""
    from builders import collective

    no_sync = {"0": forwards(synced=0, unsynced=1)}
    wrap = ddp_wrap(NAMES)
    wrap.shapes = [[4, 3], [4]]

    def rank(offset):
        events = [step(n, fp(1.0 + offset, 2.0), ddp=no_sync) for n in (1, 2, 3, 4)]
        for n in (2, 4):  # after steps 2 and 4: one all_reduce per parameter, with its shape
            for i, shape in enumerate(([4, 3], [4])):
                call = collective("all_reduce", 10 * n + i, shape, line=27, t=float(n) + 0.5)
                call.step = n
                events.append(call)
        return events

    result = run(2, [wrap, optimizer(NAMES)], {0: rank(0.0), 1: rank(0.5)})
    finding = only_finding(result)
    assert finding.severity == "info" and finding.evidence["case"] == "periodic-averaging"
    assert finding.evidence["averaged_after_steps"] == [2, 4]
    assert "every 2 optimizer steps at train.py:27 (Local SGD)" in finding.message
    assert result.summary.startswith("replicas averaged every 2 optimizer steps by the script")
    # Without the averaging, the same local steps are the error they are.
    plain = run(2, [wrap, optimizer(NAMES)], {r: [e for e in rank(o) if e.kind == "step"]
                                              for r, o in ((0, 0.0), (1, 0.5))})
    assert only_finding(plain).severity == "error"
    assert only_finding(plain).evidence["case"] == "step-in-no-sync"
