"""Inline suppression: parsed from comments, applied to the finding on that line, never silent."""

from __future__ import annotations

import pytest
from builders import SCRIPT, ddp_wrap, distributed_sampler, distributed_shard, init_pg, loader_pass, make_evidence

from ddpdoctor.analysis.api import Finding, Location
from ddpdoctor.analysis.registry import load_checks
from ddpdoctor.analysis.runner import analyze, select_checks
from ddpdoctor.analysis.suppression import Suppression, apply, parse


def test_comments_are_parsed_with_ids_and_reason():
    lines = ["x = 1\n", "loader = DataLoader(d)  # ddpdoctor: ignore[set-epoch, sampler-disjoint] one epoch only\n",
             "# ddpdoctor: ignore[gradient-sync]\n"]
    assert parse("/a.py", lines) == [
        Suppression("/a.py", 2, ("set-epoch", "sampler-disjoint"), "one epoch only"),
        Suppression("/a.py", 3, ("gradient-sync",), ""),
    ]


def test_a_matching_finding_is_suppressed_and_a_stale_comment_reported():
    finding = Finding(check="set-epoch", severity="warning", message="m", fix="f", location=Location("/a.py", 2))
    other = Finding(check="set-epoch", severity="warning", message="m", fix="f", location=Location("/a.py", 9))
    used = Suppression("/a.py", 2, ("set-epoch",), "why")
    stale = Suppression("/a.py", 5, ("set-epoch",), "old")
    wrong_check = Suppression("/a.py", 9, ("gradient-sync",), "")
    kept, suppressed, unused = apply([finding, other], [used, stale, wrong_check])
    assert kept == [other]
    assert suppressed == [(finding, used)]
    assert unused == [stale, wrong_check]


def test_the_runner_moves_suppressed_findings_out_of_the_top_level():
    events = {r: [init_pg(2), ddp_wrap()] + [loader_pass(distributed_shard(8, 2, r), number=n, dataset_len=8,
                                             sampler=distributed_sampler(2, r, 8, epoch=0)) for n in (0, 1)]
              for r in (0, 1)}
    evidence = make_evidence(2, events)
    analysis = analyze(evidence, suppressions=[Suppression(SCRIPT, 12, ("set-epoch",), "a fixed order on purpose")])
    assert [f.check for f in analysis.findings] == []
    (finding, reason), = [(f, s.reason) for f, s in analysis.suppressed]
    assert finding.check == "set-epoch" and reason == "a fixed order on purpose"
    (outcome,) = [o for o in analysis.outcomes if o.id == "set-epoch"]
    assert outcome.status == "pass" and "suppressed inline: a fixed order on purpose" in outcome.summary


def test_select_and_ignore_by_check_id():
    checks = load_checks()
    assert [c.id for c in select_checks(checks, select=["set-epoch", "rank-failure"])] == ["set-epoch", "rank-failure"]
    assert "set-epoch" not in [c.id for c in select_checks(checks, ignore=["set-epoch"])]
    with pytest.raises(ValueError, match="unknown check id 'set-epochs'"):
        select_checks(checks, select=["set-epochs"])
