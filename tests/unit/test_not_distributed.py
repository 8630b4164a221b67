"""not-distributed: no process group, or a process group without DDP."""

from __future__ import annotations

from builders import (SCRIPT, data_parallel, ddp_wrap, exception, fp, init_pg, loader_pass, make_evidence, merge,
                      on_all, optimizer, process_start, step, stop_snapshot)

from ddpdoctor.analysis.api import Location
from ddpdoctor.analysis.causality import link
from ddpdoctor.checks.gradient_sync import analyze as gradient_sync
from ddpdoctor.checks.not_distributed import analyze
from ddpdoctor.checks.sampler_disjoint import analyze as sampler_disjoint


def test_no_process_group_is_an_error_naming_the_independent_copies():
    evidence = make_evidence(2, [process_start(), step(1, fp(1.0))])
    result = analyze(evidence)
    (finding,) = result.findings
    assert finding.check == "not-distributed"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location is None
    assert finding.message == ("the script never called torch.distributed.init_process_group: 2 independent copies "
                               "of the script ran, nothing was distributed")
    assert finding.evidence.to_json() == {"kind": "no-process-group", "processes": 2}
    assert "init_process_group" in finding.fix
    assert result.status == "fail"


def test_a_lone_unranked_process_without_process_group_is_an_error():
    evidence = make_evidence(0, {}, unranked=[process_start()])
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.ranks == ()
    assert "the script ran alone" in finding.message
    assert finding.evidence.to_json() == {"kind": "no-process-group", "processes": 1}


def test_process_group_without_ddp_or_training_is_a_warning():
    result = analyze(make_evidence(2, [init_pg(2, line=7)]))
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 7)
    assert "no model was wrapped in DistributedDataParallel and no optimizer stepped" in finding.message
    assert finding.evidence.to_json() == {"kind": "no-training", "optimizer_steps": 0}
    assert result.status == "warn"


def test_process_group_without_ddp_and_diverging_gradients_is_a_warning():
    evidence = make_evidence(2, merge(on_all(2, init_pg(2), optimizer(["w"], in_ddp=[False])),
                                      {0: [step(1, fp(1.0))], 1: [step(1, fp(2.0))]}))
    (finding,) = analyze(evidence).findings
    assert finding.severity == "warning"
    assert finding.message == ("a process group was initialized but the model was never wrapped in "
                               "DistributedDataParallel")
    assert finding.evidence.to_json() == {"kind": "no-ddp", "optimizer_steps": 2}


def test_gradients_averaged_by_hand_without_ddp_is_info():
    steps = [step(1, fp(1.0)), step(2, fp(0.5))]
    evidence = make_evidence(2, [init_pg(2), optimizer(["w"], in_ddp=[False]), *steps])
    result = analyze(evidence)
    (finding,) = result.findings
    assert finding.severity == "info"
    assert "gradients matched across ranks in 2 steps" in finding.message
    assert finding.evidence.to_json() == {"kind": "averaged-by-hand", "steps_compared": 2}
    assert result.status == "pass"


def test_process_group_and_ddp_is_clean():
    result = analyze(make_evidence(2, [init_pg(2), ddp_wrap(), step(1, fp(1.0, 2.0))]))
    assert result.findings == []
    assert result.status == "pass"


def test_single_process_with_process_group_and_ddp_is_clean():
    result = analyze(make_evidence(1, [init_pg(1), ddp_wrap()]))
    assert result.findings == []
    assert result.status == "pass"


def test_no_evidence_at_all_is_skipped():
    result = analyze(make_evidence(2, {}))
    assert result.status == "skip"
    assert result.summary == "no rank produced evidence"


def test_never_fires_once_a_rank_failed():
    # A crash at import, or before any training, on every rank: rank-failure names it; that no
    # process group or DDP was reached proves nothing.
    evidence = make_evidence(2, [process_start(), exception("ModuleNotFoundError", "No module named 'timm'")],
                             outcome="failed")
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "skip"


def test_never_fires_when_ddpdoctor_stopped_the_job():
    stop = stop_snapshot({0: {}, 1: {}}, {}, reason="timeout")
    result = analyze(make_evidence(2, [init_pg(2)], outcome="timeout", stop=stop))
    assert result.findings == []


# -- nn.DataParallel under a multi-process launch ------------------------------------------------------

def test_data_parallel_without_process_group_is_the_root_at_its_line():
    """A tutorial's `model = nn.DataParallel(model).to(device)` launched with torchrun."""
    evidence = make_evidence(2, [process_start(), data_parallel("Net", line=18), step(1, fp(1.0))])
    result = analyze(evidence)
    (finding,) = result.findings
    assert (finding.severity, finding.location) == ("error", Location(SCRIPT, 18))
    assert finding.message.startswith("the model (Net) is wrapped in nn.DataParallel and the script never called "
                                      "torch.distributed.init_process_group: each of the 2 processes trains its "
                                      "own copy")
    assert finding.evidence.to_json() == {"kind": "no-process-group", "module": "Net", "device_ids": [0, 1],
                                          "processes": 2}
    assert "DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])" in finding.fix
    assert "DistributedSampler" in finding.fix and "one plain `python train.py` process" in finding.fix
    assert result.summary == "nn.DataParallel in every process, no process group"


def test_data_parallel_with_a_process_group_is_an_error_not_a_missing_ddp_warning():
    evidence = make_evidence(2, [init_pg(2), data_parallel(), step(1, fp(1.0)), step(2, fp(0.5))])
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error" and finding.location == Location(SCRIPT, 18)
    assert "wrapped in nn.DataParallel, not in DistributedDataParallel" in finding.message
    assert finding.evidence["kind"] == "data-parallel"


def test_what_data_parallel_copies_disagree_on_follows_from_it():
    """Each process draws every sample and its replica drifts: consequences of the one root."""
    evidence = make_evidence(2, merge(on_all(2, init_pg(2), data_parallel(), optimizer(["w"], in_ddp=[False]),
                                             loader_pass(list(range(16)), dataset_len=16, ddp_forwards=0)),
                                      {0: [step(1, fp(1.0), fp(1.0))], 1: [step(1, fp(2.0), fp(2.0))]}))
    findings = [*analyze(evidence).findings, *sampler_disjoint(evidence).findings, *gradient_sync(evidence).findings]
    assert {f.check for f in findings} == {"not-distributed", "sampler-disjoint", "gradient-sync"}
    (root,) = link(findings)
    assert root.check == "not-distributed"
    assert {c.check for c in root.consequences} == {"sampler-disjoint", "gradient-sync"}


def test_data_parallel_in_one_process_or_beside_ddp_is_not_named():
    assert analyze(make_evidence(2, [init_pg(2), ddp_wrap(), data_parallel(), step(1, fp(1.0))])).findings == []
    (alone,) = analyze(make_evidence(1, [process_start(), data_parallel(), step(1, fp(1.0))])).findings
    assert "DataParallel" not in alone.message
