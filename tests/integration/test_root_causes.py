"""The right root cause, and no false alarm, on patterns real training code uses (issues #16, #21).

Each class of mistake has a known-bad fixture and a known-good twin; the exact (check, severity) of
the root findings and the checks among their consequences are asserted through the JSON report.
Real torchrun, 2 gloo ranks on CPU.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration

# (fixture, script arguments) -> ({check: severity} of the top-level findings, info included, exactly;
#                               the checks of their consequences, exactly)
PAIRS = {
    # DDP's own collectives in the trace: a rank-only forward through the wrapper misaligns them.
    ("bad_eval_rank0_through_ddp.py", ()): ({"collective-hang": "error"}, {"rank-failure"}),
    ("bad_eval_rank0_through_ddp.py", ("--bare-module",)): ({}, set()),
    # uneven-inputs only when DDP's iteration counts differ, whatever the loaders' bookkeeping.
    ("bad_break_on_one_rank.py", ()): ({"uneven-inputs": "error"}, {"collective-hang", "rank-failure"}),
    ("good_loader_patterns.py", ()): ({}, set()),
    # Identical batches at the same step, from a hand-written loader: an error only when trained on.
    ("bad_token_loader_same_seed.py", ()): ({"sampler-disjoint": "error"}, set()),
    ("bad_token_loader_same_seed.py", ("--seed-offset-by-rank",)): ({}, set()),
    ("good_benchmark_same_input.py", ()): ({"sampler-disjoint": "info"}, set()),
    # The same noise on every rank (seeded alike) beside a sharded loader: one finding for both models.
    ("good_gan.py", ("--same-noise",)): ({"sampler-disjoint": "error"}, set()),
    ("good_gan.py", ()): ({}, set()),
    # The crash of a rank that read a torn checkpoint is the race's consequence.
    # The reader's crash in torch.load follows; so does the writer's collective that the crashed reader never
    # joined, when the writer reaches it before the crash is seen (a race: OPTIONAL below).
    ("bad_ckpt_read_while_writing.py", ()): ({"rank0-checkpoint": "error"}, {"rank-failure"}),
    ("good_ckpt_resume.py", ()): ({}, set()),
    # Evaluation passes inside the training loop are not training passes for set-epoch.
    ("eval_inside_training_loop.py", ("--forget-set-epoch",)): ({"set-epoch": "warning"}, set()),
    ("eval_inside_training_loop.py", ()): ({}, set()),
}


# Consequences that may or may not be attached, as the ranks' timing decides (never a root either way).
OPTIONAL = {("bad_ckpt_read_while_writing.py", ()): {"collective-hang"}}


@pytest.mark.parametrize("fixture, args", sorted(PAIRS), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_root_findings_and_consequences(run_check, fixture, args):
    roots, consequences = PAIRS[(fixture, args)]
    # a known-good twin takes the default options, so it shares its run with test_known_good_fixtures
    serious = {check: severity for check, severity in roots.items() if severity != "info"}
    run = run_check(fixture, *(("--hang-timeout", "10") if serious else ()), script_args=args)
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(roots.items()), (run.findings(), run.output[-3000:])
    assert run.returncode == (1 if serious else 0), run.output[-3000:]
    attached = {c["check"] for f in run.findings() for c in f["consequences"]}
    assert attached - OPTIONAL.get((fixture, args), set()) == consequences, (attached, run.output[-3000:])
    if not serious:
        assert run.report["outcome"] == "completed"
        assert run.report["probe_errors"] == []


def _line(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")


def test_a_rank_only_ddp_forward_is_named_with_its_line(run_check):
    run = run_check("bad_eval_rank0_through_ddp.py", "--hang-timeout", "10")
    (finding,) = run.findings("collective-hang", "error")
    assert finding["location"]["line"] == _line("bad_eval_rank0_through_ddp.py", "# BUG")
    assert finding["message"].startswith("rank 0 ran 2 forwards through the DDP wrapper")
    assert finding["evidence"]["rank_only"] == "ddp-forward" and finding["evidence"]["never_ran"] == [1]
    assert "model.module(x)" in finding["fix"]


def test_identical_batches_name_the_forward_line(run_check):
    run = run_check("bad_token_loader_same_seed.py", "--hang-timeout", "10")
    (finding,) = run.findings("sampler-disjoint", "error")
    assert finding["location"]["line"] == _line("bad_token_loader_same_seed.py", "logits = model(x)")
    assert finding["evidence"]["kind"] == "same-step"
    assert finding["evidence"]["identical_forwards"] == finding["evidence"]["forwards_compared"] == 6


def test_identical_noise_names_the_generator_forward_and_counts_the_critic_in(run_check):
    run = run_check("good_gan.py", "--hang-timeout", "10", script_args=("--same-noise",))
    (finding,) = run.findings("sampler-disjoint", "error")
    assert finding["location"]["line"] == _line("good_gan.py", "fake = generator(noise)")
    assert finding["evidence"]["made_in_script"] is True and finding["evidence"]["also_modules"] == ["ddp1"]
    assert "the script made them" in finding["message"]


def test_identical_inputs_without_an_optimizer_step_are_info(run_check):
    run = run_check("good_benchmark_same_input.py")
    (finding,) = run.findings("sampler-disjoint")
    assert finding["severity"] == "info" and finding["evidence"]["trained"] is False


def test_a_resumed_run_reading_a_checkpoint_rank0_later_overwrites_is_clean(run_check, tmp_path):
    """The checkpoint exists before the job (an earlier run wrote it): every rank reads it at start-up."""
    subprocess.run([sys.executable, "-c", "import torch; from _synthetic import SmallCNN; "
                    f"torch.save({{'model': SmallCNN().state_dict(), 'epoch': 3}}, {str(tmp_path / 'ckpt.pt')!r})"],
                   cwd=FIXTURES, check=True, timeout=120)
    run = run_check("good_ckpt_resume.py", script_args=("--out", str(tmp_path)))
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set(), run.findings()
    summary = next(c["summary"] for c in run.report["checks"] if c["id"] == "rank0-checkpoint")
    assert summary == "2 save(s), 2 load(s)"
