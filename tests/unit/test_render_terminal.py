"""The terminal report reads as prose over the user's code: every finding shows its source line with a
caret, a hang shows each rank's place side by side, evidence is in words (no JSON, no internal
keys, nothing cut mid-word), and a consequence never wears a pass mark."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from ddpdoctor.analysis.api import Consequence, EvidenceRecord, Finding, Location, evidence_field
from ddpdoctor.analysis.render.terminal import render
from ddpdoctor.analysis.report import CheckStatus, Report

from ddpdoctor.analysis.registry import load_checks

load_checks()  # the checks register their evidence types: a built-in check's dict evidence below is typed as theirs

TRAIN = """\
import torch.distributed as dist


def validate(model):
    model.eval()
    dist.barrier()  # only rank 0 gets here
    model.train()


def main():
    for x, y in loader:
        loss = model(x).sum()
        loss.backward()
"""


def report_of(*findings: Finding, checks=(), sources=None, width: int = 160) -> Report:
    return Report(version="0", script="/job/train.py", argv=[], world_size=2, nnodes=1, backend="gloo",
                  device="cpu", outcome="hung", duration_s=1.0, launch_mode="torchrun", findings=list(findings),
                  checks=list(checks), sources=sources or {})


def rendered(report: Report, *, plain: bool = True, width: int = 160) -> str:
    out = io.StringIO()
    render(Console(file=out, width=width, no_color=True, soft_wrap=plain), report, plain=plain)
    return out.getvalue()


def hang_finding(train: str) -> Finding:
    return Finding(check="collective-hang", severity="error", message="the job hung", fix="Make every rank call it.",
                   location=Location(train, 6), ranks=(0, 1), evidence={
                       "kind": "hang", "first_divergence": 3, "threshold_s": 30.0,
                       "ranks": {"0": {"state": "waiting", "waiting_in": "barrier #3", "stalled_s": 31.0,
                                       "where": {"file": train, "line": 6, "function": "validate"},
                                       "last_collective": {"op": "barrier", "n": 3}},
                                 "1": {"state": "waiting",
                                       "waiting_in": "the backward pass (DDP's gradient all-reduce)",
                                       "stalled_s": 31.0, "where": {"file": train, "line": 13, "function": "main"},
                                       "last_collective": {"op": "all_reduce", "n": 2}}},
                       "timeline": {"0": {"2": "all_reduce at train.py:9", "3": "barrier at train.py:6"},
                                    "1": {"2": "all_reduce at train.py:9"}}})


def test_a_finding_shows_the_users_line_with_a_caret(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    text = rendered(report_of(hang_finding(str(train))))
    assert f"--> {train}:6" in text
    assert " 5 |     model.eval()" in text and " 6 |     dist.barrier()  # only rank 0 gets here" in text
    assert "   |     ^^^^^^^^^^^^^^\n" in text  # the statement, not its comment
    assert '{"' not in text and "threshold" not in text


def test_a_hang_shows_each_ranks_line_side_by_side(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths shown relative to the working directory, as in a project
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    text = rendered(report_of(hang_finding(str(train))))
    lines = text.splitlines()
    header = next(line for line in lines if "rank 0: waiting in barrier #3" in line)
    assert "rank 1: waiting in the backward pass (DDP's gradient all-reduce)" in header  # the same row
    assert any("6 |     dist.barrier()" in line and "13 |         loss.backward()" in line for line in lines)
    assert any("no progress for 31 s · last collective #3 barrier" in line for line in lines)
    assert "#3 ← first divergence" in text and "never called" in text


def test_a_stall_that_resolved_says_where_the_ranks_were_during_it_not_when_stopped(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    stall = Finding(check="collective-hang", severity="info", message="no rank made progress for 7s", ranks=(0, 1),
                    fix="Nothing to do.", location=None, evidence={
                        "kind": "stall", "ranks": {"0": {"state": "busy", "waiting_in": "an import (slow.py)"},
                                                   "1": {"state": "waiting", "waiting_in": "barrier #3"}}})
    text = rendered(report_of(stall))
    assert "where each rank was during the stall:" in text and "when the job was stopped" not in text
    assert "where each rank was when the job was stopped:" in rendered(report_of(hang_finding(str(train))))


def test_ranks_whose_lines_do_not_fit_side_by_side_are_listed_one_under_another(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    text = rendered(report_of(hang_finding(str(train))), width=90)
    lines = text.splitlines()
    assert not any("rank 0: waiting" in line and "rank 1: waiting" in line for line in lines)
    assert all(not line.startswith("all_reduce") for line in lines)  # no code line broken onto the next
    assert "rank 1: waiting in the backward pass" in text and "13 |         loss.backward()" in text


def test_code_comes_from_the_reports_sources_when_the_file_is_elsewhere():
    finding = Finding(check="gradient-sync", severity="error", message="gradients differ", fix="Call model(x).",
                      location=Location("/elsewhere/train.py", 24))
    sources = {"/elsewhere/train.py": {"23": "        out = model.module(x)  # bypass", "24": "        opt.step()"}}
    text = rendered(report_of(finding, sources=sources))
    assert "23 |         out = model.module(x)  # bypass" in text and "24 |         opt.step()" in text


def test_a_missing_file_degrades_to_file_and_line():
    finding = Finding(check="set-epoch", severity="warning", message="no set_epoch", fix="Call set_epoch.",
                      location=Location("/gone/train.py", 18))
    text = rendered(report_of(finding))
    assert "--> /gone/train.py:18" in text and "fix: Call set_epoch." in text


@dataclass(frozen=True)
class Mixed(EvidenceRecord):
    """A record with a field of every kind of unit a check declares."""

    ddp: int = evidence_field(default=0, hidden=True)
    case: str = evidence_field(default="ddp-bypassed", hidden=True)
    unused: list[str] = evidence_field(default_factory=list, label="unused parameters", unit="names")
    iterations_without_grad: dict[str, dict[str, int]] = evidence_field(default_factory=dict,
                                                                        label="iterations without a gradient")
    relative_difference: float = evidence_field(default=0.0, label="relative difference", unit="fraction")
    write_site: list[dict[str, Any]] = evidence_field(default_factory=list, label="written at", unit="site")
    batches: dict[str, int] = evidence_field(default_factory=dict, label="batches per rank")
    sampler_epochs: list[int] = evidence_field(default_factory=list, label="sampler epoch in each pass")
    wait_s: float = evidence_field(default=0.0)
    nested: dict[str, Any] = evidence_field(default_factory=dict)


def test_evidence_reads_as_words_not_json():
    finding = Finding(check="unused-parameters", severity="error", message="unused", fix="f", evidence=Mixed(
        unused=["aux.weight", "aux.bias"],
        iterations_without_grad={"aux.weight": {"0": 1, "1": 1}, "aux.bias": {"0": 1, "1": 2}},
        relative_difference=0.29843388736887105, write_site=[{"file": "/a/t.py", "line": 31, "function": "main"}],
        batches={"0": 11, "1": 10}, sampler_epochs=[0, 0, 0, 0], wait_s=12.5, nested={"a": [1, {"b": 2}]}))
    text = rendered(report_of(finding))
    assert '{"' not in text and "ddp-bypassed" not in text and "ddp " not in text
    assert "`aux.weight`, `aux.bias`" in text
    assert "aux.weight: 1 on ranks 0, 1" in text and "aux.bias: rank 0: 1 · rank 1: 2" in text
    assert "29.8 %" in text and "0.2984" not in text
    assert "written at" in text and "t.py:31 (main)" in text
    assert "batches per rank" in text and "rank 0: 11 · rank 1: 10" in text
    assert "0 (all 4)" in text and "12.5 s" in text


def test_a_consequence_is_shown_under_its_cause_and_its_check_is_not_a_pass():
    cause = Finding(check="unused-parameters", severity="error", message="aux got no gradient", fix="f",
                    consequences=(Consequence(check="gradient-sync", message="gradients differ at step 1",
                                              location=Location("/job/_synthetic.py", 83)),))
    checks = [CheckStatus(id="gradient-sync", title="t", status="pass",
                          summary="replicas diverge at step 1 (a consequence of unused-parameters, reported there)",
                          consequence_of="unused-parameters"),
              CheckStatus(id="unused-parameters", title="t", status="fail", summary="aux got no gradient"),
              CheckStatus(id="collective-bandwidth", title="t", status="skip", summary="no collective benchmark ran")]
    plain = rendered(report_of(cause, checks=checks))
    assert "[CONSEQUENCE] gradient-sync: replicas diverge" in plain and "[PASS] gradient-sync" not in plain
    assert "-> consequence (gradient-sync): gradients differ at step 1" in plain
    rich = rendered(report_of(cause, checks=checks), plain=False)
    line = next(line for line in rich.splitlines() if "gradient-sync " in line and "replicas diverge" in line)
    assert "↳" in line and "✓" not in line
    assert "collective-bandwidth  no collective benchmark ran" in rich  # long ids keep their gap


def test_plain_sentences_are_never_cut():
    long = "word " * 80
    finding = Finding(check="rank-failure", severity="error", message=long.strip(), fix=long.strip())
    text = rendered(report_of(finding), width=80)
    assert long.strip() in text.replace("\n    ", " ")
    assert all(not line.rstrip().endswith("wor") for line in text.splitlines())


def test_a_mismatch_shows_each_ranks_call_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = tmp_path / "train.py"
    train.write_text("import torch.distributed as dist\n\nstats = torch.ones(4 + rank)\ndist.all_reduce(stats)\n")
    site = [{"file": str(train), "line": 4, "function": "main"}]
    finding = Finding(check="collective-hang", severity="error", message="collective #1 differs across ranks",
                      fix="Same shapes.", location=Location(str(train), 4), evidence={
                          "kind": "mismatch", "sequence": 1,
                          "calls": {"0": {"op": "all_reduce", "tensors": [[[4], "float32"]], "site": site},
                                    "1": {"op": "all_reduce", "tensors": [[[5], "float32"]], "site": site}}})
    text = rendered(report_of(finding))
    row = next(line for line in text.splitlines() if "rank 0: all_reduce of float32[4]" in line)
    assert "rank 1: all_reduce of float32[5]" in row
    assert '{"' not in text and "sequence" not in text and "mismatch" not in text


def test_ddps_own_collectives_are_named_by_what_they_belong_to():
    site = [{"file": "/gone/train.py", "line": 41, "function": "main"}]
    finding = Finding(check="collective-hang", severity="error", message="rank 0 ran 2 forwards through DDP", fix="f",
                      location=Location("/gone/train.py", 41), evidence={
                          "kind": "mismatch", "sequence": 13, "culprit": 0, "culprit_phase": "ddp-forward",
                          "rank_only": "ddp-forward", "never_ran": [1], "collectives_from_line": {"0": 4, "1": 0},
                          "calls": {"0": {"op": None, "phase": "ddp-forward", "tensors": [], "site": site},
                                    "1": {"op": "broadcast", "phase": "ddp-forward", "tensors": [], "site": site}}})
    text = rendered(report_of(finding))
    assert "rank 0: DDP's forward (its buffer or bucket broadcast)" in text
    assert "rank 1: broadcast in DDP's forward (its buffer or bucket broadcast)" in text
    assert "never ran it" in text and "rank 1" in text and "rank 0: 4 · rank 1: 0" in text
    assert "culprit" not in text and "ddp-forward" not in text and "None" not in text


def test_a_failed_probe_names_the_checks_it_left_incomplete_or_says_it_left_none():
    report = report_of()
    report.probe_errors = [
        {"probe": "optimizer", "error": "RuntimeError: boom", "target": None, "phase": "run", "ranks": [0],
         "checks": ["gradient-sync", "config-sync"]},
        {"probe": "fused-fingerprint-kernel", "error": "RuntimeError: no kernel image", "phase": "run",
         "target": "the per-tensor kernels took over", "ranks": [0, 1], "checks": []},
        {"probe": "flight-recorder-missing", "error": "no dump from rank 1", "target": None, "phase": "run",
         "ranks": [], "checks": ["collective-hang"]}]
    lines = [line for line in rendered(report).splitlines() if line.startswith("ddpdoctor: probe")]
    assert lines == [
        "ddpdoctor: probe optimizer failed (RuntimeError: boom) on rank 0; checks left incomplete: gradient-sync, "
        "config-sync",
        "ddpdoctor: probe fused-fingerprint-kernel failed (RuntimeError: no kernel image) on ranks 0, 1; no check "
        "left incomplete",
        "ddpdoctor: probe flight-recorder-missing failed (no dump from rank 1); checks left incomplete: "
        "collective-hang"]
