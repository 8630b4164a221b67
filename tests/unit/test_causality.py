"""The causality pass: a finding another explains becomes its consequence, chains flatten onto the
root, independent problems stay apart, and no cycle forms."""

from __future__ import annotations

from ddpdoctor.analysis.api import Finding
from ddpdoctor.analysis.causality import link
from ddpdoctor.analysis.registry import load_checks

load_checks()  # the checks register their evidence types: the findings below are typed as theirs would be


def finding(check, severity="error", **evidence):
    """A finding of ``check`` whose evidence is typed as that check's (read back as a saved report's is)."""
    return Finding.from_json({"check": check, "severity": severity, "message": f"{check} message", "fix": "fix",
                              "evidence": evidence})


def checks(findings):
    return [(f.check, [c.check for c in f.consequences]) for f in findings]


def test_the_peers_crash_is_a_consequence_of_a_rank_running_out_of_data():
    roots = link([finding("uneven-inputs", cause="data"), finding("rank-failure", secondary_only=True)])
    assert checks(roots) == [("uneven-inputs", ["rank-failure"])]


def test_a_hang_is_a_consequence_of_uneven_data_and_keeps_its_evidence():
    hang = finding("collective-hang", kind="hang", ranks={"0": {"state": "waiting"}})
    (root,) = link([hang, finding("uneven-inputs", cause="data")])
    assert root.check == "uneven-inputs"
    (consequence,) = root.consequences
    assert consequence.evidence["ranks"]["0"]["state"] == "waiting"
    assert consequence.severity == "error"


def test_batch_skew_from_diverged_control_flow_is_a_consequence_of_the_collectives():
    roots = link([finding("uneven-inputs", cause="control-flow"), finding("collective-hang", kind="hang")])
    assert checks(roots) == [("collective-hang", ["uneven-inputs"])]


def test_a_crash_inside_the_mismatched_collective_is_a_consequence():
    roots = link([finding("collective-hang", kind="mismatch", sequence=1),
                  finding("rank-failure", secondary_only=False, seq=1)])
    assert checks(roots) == [("collective-hang", ["rank-failure"])]


def test_a_crash_before_the_mismatch_is_independent():
    roots = link([finding("collective-hang", kind="mismatch", sequence=5),
                  finding("rank-failure", secondary_only=False, seq=2)])
    assert checks(roots) == [("collective-hang", []), ("rank-failure", [])]


def test_unused_parameters_explain_ddps_crash_and_the_gradient_difference():
    roots = link([finding("gradient-sync", case="reduction-incomplete"),
                  finding("rank-failure", reduction_error=True, secondary_only=False),
                  finding("unused-parameters")])
    assert checks(roots) == [("unused-parameters", ["gradient-sync", "rank-failure"])]


def test_a_bypassed_forward_explains_drifting_buffers_but_a_knowing_choice_is_independent():
    bypass = finding("gradient-sync", case="ddp-bypassed")
    assert (checks(link([bypass, finding("buffer-sync", broadcast_buffers=True)]))
            == [("gradient-sync", ["buffer-sync"])])
    knowing = finding("buffer-sync", "warning", broadcast_buffers=False)
    assert checks(link([bypass, knowing])) == [("gradient-sync", []), ("buffer-sync", [])]


def test_a_model_never_wrapped_is_reported_once():
    roots = link([finding("gradient-sync", case="not-wrapped"), finding("not-distributed", "warning")])
    assert checks(roots) == [("gradient-sync", ["not-distributed"])]


def test_a_rank_that_crashed_first_explains_its_peers_orphaned_collective():
    roots = link([finding("collective-hang", kind="orphan", never_called_by=[1]),
                  finding("rank-failure", secondary_only=False, failed_ranks=[0, 1], seq=0)])
    assert checks(roots) == [("rank-failure", ["collective-hang"])]


def test_chains_flatten_onto_the_root():
    # collective-hang explains uneven-inputs (control flow) and the crash inside the collective.
    roots = link([finding("rank-failure", secondary_only=True), finding("uneven-inputs", cause="control-flow"),
                  finding("collective-hang", kind="hang", sequence=None)])
    assert checks(roots) == [("collective-hang", ["rank-failure", "uneven-inputs"])]


def test_info_findings_are_never_causes_and_independent_problems_stay_apart():
    roots = link([finding("uneven-inputs", "info", cause="data"), finding("rank-failure", secondary_only=True),
                  finding("set-epoch", "warning")])
    assert checks(roots) == [("uneven-inputs", []), ("rank-failure", []), ("set-epoch", [])]


def test_no_cycle_when_two_findings_could_explain_each_other():
    a = finding("uneven-inputs", cause="data")
    b = finding("collective-hang", kind="hang")
    roots = link([a, b])
    assert len(roots) == 1 and len(roots[0].consequences) == 1


def test_without_a_process_group_the_copies_disagreeing_is_a_consequence():
    roots = link([finding("sampler-disjoint"), finding("not-distributed", kind="no-process-group")])
    assert checks(roots) == [("not-distributed", ["sampler-disjoint"])]


def test_a_rank_that_left_its_loop_early_is_the_root_of_ddps_unmatched_all_reduce():
    orphan = finding("collective-hang", kind="orphan", culprit_phase="ddp-backward")
    roots = link([orphan, finding("uneven-inputs", cause="control-flow"), finding("rank-failure", secondary_only=True)])
    assert checks(roots) == [("uneven-inputs", ["collective-hang", "rank-failure"])]


def test_a_users_call_some_ranks_skipped_stays_the_root_of_the_uneven_counts():
    hang = finding("collective-hang", kind="hang", culprit_phase="call")
    roots = link([finding("uneven-inputs", cause="control-flow"), hang])
    assert checks(roots) == [("collective-hang", ["uneven-inputs"])]


def test_the_crash_of_a_reader_of_a_torn_checkpoint_is_a_consequence_of_the_race():
    race = finding("rank0-checkpoint", reader=1, writer=0, read_error="RuntimeError: PytorchStreamReader failed")
    roots = link([race, finding("rank-failure", rank=1, secondary_only=False)])
    assert checks(roots) == [("rank0-checkpoint", ["rank-failure"])]
    other = link([race, finding("rank-failure", rank=0, secondary_only=False)])
    assert checks(other) == [("rank0-checkpoint", []), ("rank-failure", [])]


def test_iteration_counts_a_hang_cut_short_follow_from_the_hang():
    """A rank stuck in a rank-only barrier ran fewer DDP iterations than its peer, with no loader
    pass to tell why (cause unknown): the counts are the hang's consequence."""
    hang = finding("collective-hang", kind="hang", culprit_phase="call")
    roots = link([hang, finding("uneven-inputs", cause="unknown")])
    assert checks(roots) == [("collective-hang", ["uneven-inputs"])]


def test_a_rank_gloo_aborted_on_the_mismatch_is_a_consequence_of_the_rank_only_collective():
    """A killed rank records no number of the collective it died in (its seq is its last event's):
    gloo's own abort message ties it to the divergence, so the crash rule does not take the root."""
    orphan = finding("collective-hang", kind="orphan", sequence=8, never_called_by=[1], rank_only="ddp-forward")
    aborted = finding("rank-failure", secondary_only=False, failed_ranks=[0, 1], seq=7, kind="signal",
                      decoded={"code": "collective-mismatch"})
    assert checks(link([aborted, orphan])) == [("collective-hang", ["rank-failure"])]


def test_a_rank_killed_without_gloos_mismatch_message_stays_the_root():
    orphan = finding("collective-hang", kind="orphan", sequence=8, never_called_by=[1])
    killed = finding("rank-failure", secondary_only=False, failed_ranks=[0, 1], seq=7, kind="signal")
    assert checks(link([killed, orphan])) == [("rank-failure", ["collective-hang"])]
