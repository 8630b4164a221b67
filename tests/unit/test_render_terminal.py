"""The terminal report renders every finding's evidence, whatever its shape (no crash on a list
where a per-rank table would take a dict), with per-rank tables and a hang timeline."""

from __future__ import annotations

import io

from rich.console import Console

from ddpdoctor.analysis.api import Finding, Location
from ddpdoctor.analysis.render.terminal import render
from ddpdoctor.analysis.report import Report


def rendered(*findings: Finding) -> str:
    report = Report(version="0", script="/job/train.py", argv=[], world_size=2, nnodes=1, backend="gloo",
                    device="cpu", outcome="hung", duration_s=1.0, launch_mode="torchrun", findings=list(findings))
    out = io.StringIO()
    render(Console(file=out, width=160, no_color=True), report, plain=True)
    return out.getvalue()


def test_a_hang_renders_a_rank_table_and_a_timeline():
    hang = Finding(check="collective-hang", severity="error", message="the job hung", fix="fix it",
                   location=Location("/job/train.py", 16), evidence={
                       "kind": "hang", "first_divergence": 3,
                       "ranks": {"0": {"state": "waiting", "waiting_in": "barrier #3", "stalled_s": 5.0,
                                       "where": {"file": "/job/train.py", "line": 16, "function": "validate"},
                                       "last_collective": {"op": "barrier", "n": 3}},
                                 "1": {"state": "exited"}},
                       "timeline": {"0": {"2": "all_reduce at train.py:9", "3": "barrier at train.py:16"},
                                    "1": {"2": "all_reduce at train.py:9"}}})
    text = rendered(hang)
    assert "waiting  barrier #3" in text and "train.py:16 (validate)" in text and "#3 barrier" in text
    assert "#3 <- diverge" in text and "barrier at train.py:16" in text


def test_evidence_of_any_shape_renders():
    failure = Finding(check="rank-failure", severity="error", message="rank 1 raised", fix="f",
                      evidence={"ranks": [1], "batches": {"0": 11, "1": 10}, "timeline": ["odd"]})
    text = rendered(failure)
    assert "batches: rank 0: 11, rank 1: 10" in text
