"""config-sync on synthetic evidence: what differs, each rank's value, the line that changed it."""

from __future__ import annotations

from builders import (SCRIPT, config_state, ddp_wrap, fp, make_evidence, merge, mode_change, on_all, optimizer,
                      param_groups_write, step)

from ddpdoctor.analysis import causality
from ddpdoctor.analysis.api import Finding, Location
from ddpdoctor.checks import config_sync, gradient_sync
from ddpdoctor.checks.config_sync import analyze

SETUP = (ddp_wrap(), optimizer(built_line=28))


def run(world_size, per_rank):
    return make_evidence(world_size, merge(on_all(world_size, *SETUP), per_rank))


def steps(digests, *, start=1):
    return [step(n, fp(1.0, 2.0), config=d) for n, d in enumerate(digests, start=start)]


def test_same_configuration_on_every_rank_passes():
    same = [config_state(1, "A"), *steps(["A", "A", "A"])]
    result = analyze(run(2, {0: same, 1: same}))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary.startswith("same modes, requires_grad, optimizer settings, autocast and loss scale")
    assert "3 compared steps" in result.summary


def test_rank_left_in_eval_mode_names_the_modules_and_the_eval_call():
    evidence = run(2, {
        0: [config_state(1, "A"), *steps(["A", "A"]), mode_change(False, line=44, step_=2),
            config_state(3, "B", eval_types={"Net": 1, "Linear": 2, "Dropout": 1, "BatchNorm1d": 1}),
            *steps(["B"], start=3)],
        1: [config_state(1, "A"), *steps(["A", "A", "A"])],
    })
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.evidence["step"] == 3
    assert finding.evidence["last_identical_step"] == 2
    assert "rank 0: BatchNorm1d and Dropout in eval mode (the whole model); rank 1: train mode" in finding.message
    assert "rank 0 switched to eval mode at train.py:44 after step 2 and never back" in finding.message
    assert finding.location == Location(SCRIPT, 44)
    assert "model.train()" in finding.fix
    (modes,) = finding.evidence["differs"]
    assert modes["what"] == "modes" and modes["values"]["1"] == "train mode"


def test_learning_rate_changed_on_one_rank_names_the_scheduler_step():
    evidence = run(2, {
        0: [config_state(1, "A", lr=0.1), step(1, fp(1.0), config="A"), param_groups_write(2, [[0, "lr"]], line=61),
            config_state(2, "B", lr=0.09), step(2, fp(1.0), config="B")],
        1: [config_state(1, "A", lr=0.1), step(1, fp(1.0), config="A"), step(2, fp(1.0), config="A")],
    })
    (finding,) = analyze(evidence).findings
    assert "`lr`: rank 0: 0.09; rank 1: 0.1" in finding.message
    assert "rank 0 changed it by an LR scheduler's step at train.py:61 before step 2" in finding.message
    assert finding.location == Location(SCRIPT, 61)
    assert "every rank" in finding.fix


def test_learning_rate_that_differs_from_the_start_points_at_the_optimizer_construction():
    evidence = run(2, {0: [config_state(1, "A", lr=0.1), step(1, fp(1.0), config="A")],
                       1: [config_state(1, "B", lr=0.2), step(1, fp(1.0), config="B")]})
    (finding,) = analyze(evidence).findings
    assert "`lr`: rank 0: 0.1; rank 1: 0.2" in finding.message
    assert "since the optimizer was built" in finding.message
    assert finding.location == Location(SCRIPT, 28)


def test_frozen_autocast_and_scale_differences_are_each_named():
    evidence = run(2, {
        0: [config_state(1, "A", frozen=2, frozen_names=["backbone.*"], autocast=[True, "torch.bfloat16"],
                         scale=65536.0), step(1, fp(1.0), config="A")],
        1: [config_state(1, "B", autocast=[False, "torch.bfloat16"], scale=32768.0), step(1, fp(1.0), config="B")],
    })
    (finding,) = analyze(evidence).findings
    whats = [d["what"] for d in finding.evidence["differs"]]
    assert whats == ["frozen", "autocast", "scale"]
    texts = {d["what"]: d["text"] for d in finding.evidence["differs"]}
    assert texts["frozen"] == "rank 0: 2 of 4 parameters frozen (`backbone.*`); rank 1: no parameter frozen"
    assert texts["autocast"] == "rank 0: autocast on (bfloat16); rank 1: autocast off"
    assert texts["scale"] == "rank 0: 65536; rank 1: 32768"


def test_floats_that_round_alike_are_shown_in_full():
    evidence = run(2, {0: [config_state(1, "A", lr=0.1), step(1, fp(1.0), config="A")],
                       1: [config_state(1, "B", lr=0.1 + 1e-12), step(1, fp(1.0), config="B")]})
    (finding,) = analyze(evidence).findings
    assert "rank 0: 0.1; rank 1: 0.100000000001" in finding.message


def test_many_ranks_are_grouped_by_their_configuration():
    per_rank = {r: [config_state(1, "A"), step(1, fp(1.0), config="A")] for r in range(8)}
    per_rank[5] = [config_state(1, "B", lr=0.5), step(1, fp(1.0), config="B")]
    (finding,) = analyze(run(8, per_rank)).findings
    assert finding.evidence["rank_groups"] == [[0, 1, 2, 3, 4, 6, 7], [5]]
    assert "ranks 0-4, 6-7: 0.1; rank 5: 0.5" in finding.message


def test_an_optimizer_of_a_rank_local_model_is_not_compared():
    local = optimizer(["w"], in_ddp=[False], opt=1)
    evidence = make_evidence(2, merge(on_all(2, *SETUP, local), {
        0: [step(1, fp(1.0), config="A"), step(1, fp(1.0), opt=1, config="L0")],
        1: [step(1, fp(1.0), config="A"), step(1, fp(1.0), opt=1, config="L1")],
    }))
    result = analyze(evidence)
    assert result.findings == []
    assert "1 compared steps" in result.summary


def test_nothing_to_compare_without_digests_or_with_one_rank():
    assert not analyze(run(2, {0: steps([None]), 1: steps([None])})).applicable
    assert not analyze(make_evidence(1, on_all(1, *SETUP, *steps(["A"])))).applicable


def test_the_divergence_that_follows_a_learning_rate_difference_is_its_consequence():
    grads = fp(1.0, 2.0)
    evidence = run(2, {
        0: [config_state(1, "A", lr=0.1), step(1, grads, fp(5.0, 6.0), config="A"),
            param_groups_write(2, [[0, "lr"]]), config_state(2, "B", lr=0.05),
            step(2, grads, fp(5.5, 6.0), config="B")],
        1: [config_state(1, "A", lr=0.1), step(1, grads, fp(5.0, 6.0), config="A"),
            step(2, grads, fp(5.0, 6.0), config="A")],
    })
    findings = [*config_sync.analyze(evidence).findings, *gradient_sync.analyze(evidence).findings]
    (root,) = causality.link(findings)
    assert root.check == "config-sync"
    assert [(c.check, c.evidence["case"]) for c in root.consequences] == [("gradient-sync", "params-modified")]


def test_parameters_frozen_on_some_ranks_explain_ddps_missing_gradients_and_its_crash():
    """Read back as saved reports are: the rule is written against symptom kinds, not check ids."""
    def finding(check, severity="error", **evidence):
        return Finding.from_json({"check": check, "severity": severity, "message": check, "fix": "",
                                  "evidence": evidence})

    frozen = finding("config-sync", what=["requires_grad: ..."], step=3, differs=[{"what": "frozen", "key": "0"}])
    lr = finding("config-sync", what=["`lr`: ..."], step=3, differs=[{"what": "hyperparameter", "key": "0:lr"}])
    unused, crash = finding("unused-parameters", unused=["head.weight"]), finding("rank-failure", reduction_error=True)
    (root,) = causality.link([frozen, unused, crash])
    assert [c.check for c in root.consequences] == ["unused-parameters", "rank-failure"]
    roots = causality.link([lr, finding("unused-parameters", "warning", never_used=["head.weight"])])
    assert [r.check for r in roots] == ["config-sync", "unused-parameters"]


def test_a_divergence_before_the_settings_differ_is_its_own_root():
    evidence = run(2, {
        0: [config_state(1, "A"), step(1, fp(1.0, 2.0), config="A"), config_state(2, "B", lr=0.05),
            step(2, fp(1.0, 2.0), config="B")],
        1: [config_state(1, "A"), step(1, fp(1.5, 2.0), config="A"), step(2, fp(1.0, 2.0), config="A")],
    })
    findings = [*config_sync.analyze(evidence).findings, *gradient_sync.analyze(evidence).findings]
    assert sorted(f.check for f in causality.link(findings)) == ["config-sync", "gradient-sync"]


# -- an optimizer's state restored on some ranks only ------------------------------------------------

def _resumed(*, loaded: bool, entries: int, state_step):
    info = optimizer(built_line=28, type_name="AdamW")
    info.loaded_at = [{"file": SCRIPT, "line": 42, "function": "main"}] if loaded else []
    info.state_entries, info.state_step = entries, state_step
    return info


def test_optimizer_state_restored_on_rank_0_only_is_the_root_at_the_load_line():
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [_resumed(loaded=True, entries=2, state_step=8.0), config_state(1, "A"), *steps(["A", "A"])],
        1: [_resumed(loaded=False, entries=0, state_step=None), config_state(1, "B"), *steps(["B", "B"])],
    }))
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error" and finding.location == Location(SCRIPT, 42)
    assert finding.evidence["restored_on"] == [0] and finding.evidence["not_restored_on"] == [1]
    assert "the AdamW built at train.py:28 starts from different states on different ranks" in finding.message
    assert "rank 0 restored it with `load_state_dict` at train.py:42 (AdamW at step 8, state for 2 parameters)" \
        in finding.message
    assert "rank 1 did not (an empty state: step 0, no moments)" in finding.message
    # The replicas' divergence that follows is its consequence.
    drift = gradient_sync.analyze(make_evidence(2, merge(on_all(2, ddp_wrap(), optimizer()), {
        0: [step(1, fp(1.0, 2.0), fp(5.0, 6.0))], 1: [step(1, fp(1.0, 2.0), fp(5.5, 6.0))]}))).findings
    (root,) = causality.link([finding, *drift])
    assert root.check == "config-sync" and [c.check for c in root.consequences] == ["gradient-sync"]


def test_every_rank_restoring_the_state_or_none_restoring_it_is_fine():
    same = [_resumed(loaded=True, entries=2, state_step=8.0), config_state(1, "A"), *steps(["A"])]
    assert analyze(run(2, {0: same, 1: same})).findings == []
    # The others got the same state another way (broadcast by hand): nothing differs.
    other = [_resumed(loaded=False, entries=2, state_step=8.0), config_state(1, "A"), *steps(["A"])]
    assert analyze(run(2, {0: same, 1: other})).findings == []
    # A sharded optimizer's ranks hold different states without any load: not compared.
    shard0 = [_resumed(loaded=False, entries=1, state_step=3.0), config_state(1, "A"), *steps(["A"])]
    shard1 = [_resumed(loaded=False, entries=2, state_step=3.0), config_state(1, "A"), *steps(["A"])]
    assert analyze(run(2, {0: shard0, 1: shard1})).findings == []
