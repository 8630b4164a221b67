"""Issue #30's probe and cause fixes, each a known-bad fixture beside its known-good twin, asserted
as exact finding sets (info included), root lines and consequences through the JSON report:

- the probes install on every import path (a find_spec look-up first, transformers first, torch
  imported before the bootstrap) and a job they cannot see is not judged (exit 2);
- nothing the probes do changes pickling, deep copies, TorchScript or torch.export of the model;
- optimizer-params judges weights that never change by measured update size (bf16);
- a backbone frozen when DDP was built, an optimizer state restored on rank 0 only, a device round
  trip after training ended.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES, CheckRun, ddpdoctor_command, run_tmpdir

pytestmark = [pytest.mark.integration, pytest.mark.realcode]


def found(run: CheckRun) -> set[tuple[str, str]]:
    """Every top-level finding as (check, severity), info included."""
    return {(f["check"], f["severity"]) for f in run.findings()}


def line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")


def assert_clean(run: CheckRun, infos: frozenset = frozenset()) -> None:
    """No finding but the ``infos`` named (check ids at severity info), exit 0, nothing unchecked."""
    assert run.report is not None, run.output[-3000:]
    assert found(run) == {(check, "info") for check in infos}, run.output[-3000:]
    assert run.returncode == 0 and run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == [] and run.report.get("unchecked") is None


def root(run: CheckRun, check: str, severity: str, fixture: str, marker: str,
         consequences: frozenset = frozenset()) -> dict:
    """The one top-level finding of the run: its check, severity, line and exact consequences."""
    assert found(run) == {(check, severity)}, run.output[-3000:]
    (finding,) = run.findings()
    assert finding["location"]["file"].endswith(fixture), finding["location"]
    assert finding["location"]["line"] == line_of(fixture, marker)
    assert {c["check"] for c in finding["consequences"]} == set(consequences), finding["consequences"]
    return finding


def run_with_sitecustomize(tmp_path: Path, fixture: str, code: str) -> CheckRun:
    """ddpdoctor check on a fixture with a sitecustomize module that runs ``code`` in every process
    before anything else (before the rank bootstrap)."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(code)
    report = tmp_path / "report.json"
    with run_tmpdir() as (temp, _left):
        env = {**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": str(temp),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(ddpdoctor_command(FIXTURES / fixture, report), cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
    data: Optional[dict] = json.loads(report.read_text()) if report.exists() else None
    return CheckRun(proc.returncode, proc.stdout + proc.stderr, data, 0.0)


# -- the probes install on every import path -------------------------------------------------------

def test_a_look_up_of_torch_before_its_import_leaves_the_probes_in(run_check):
    assert_clean(run_check("good_import_lookup_first.py"))
    bad = run_check("bad_import_lookup_first.py")
    finding = root(bad, "gradient-sync", "error", "good_import_lookup_first.py", "model.module(x) if bypass")
    assert finding["evidence"]["case"] == "ddp-bypassed"
    assert bad.returncode == 1


def test_a_script_whose_first_import_is_transformers_is_probed(run_check):
    run = run_check("good_transformers_first.py")
    assert_clean(run)
    statuses = {c["id"]: c["status"] for c in run.report["checks"]}
    assert statuses["gradient-sync"] == statuses["not-distributed"] == statuses["sampler-disjoint"] == "pass"


def test_torch_imported_before_the_bootstrap_is_probed(tmp_path):
    good = run_with_sitecustomize(tmp_path / "good", "good_import_lookup_first.py", "import torch\n")
    assert_clean(good)
    assert {c["id"]: c["status"] for c in good.report["checks"]}["gradient-sync"] == "pass"
    bad = run_with_sitecustomize(tmp_path / "bad", "bad_grad_bypass.py", "import torch\n")
    assert found(bad) == {("gradient-sync", "error")}, bad.output[-3000:]


def test_a_job_the_probes_could_not_see_is_not_judged(tmp_path):
    """Fault injection: the import hook never goes in, so torch is imported unprobed."""
    run = run_with_sitecustomize(
        tmp_path, "bad_grad_bypass.py",
        "import ddpdoctor.rank.after_import as hook\nhook.AfterImport.insert = lambda self: self\n")
    assert run.returncode == 2, run.output[-3000:]
    assert run.report["findings"] == []
    assert run.report["unchecked"]["ranks"] == [0, 1]
    assert "torch was imported without ddpdoctor's import hook firing" in run.report["unchecked"]["reason"]
    assert {c["status"] for c in run.report["checks"]} == {"skip"}
    assert (run.report["backend"], run.report["device"]) == ("unknown", "unknown")  # nothing was seen
    assert "verdict: NOT CHECKED: ddpdoctor could not check this job" in run.output


# -- the probes leave nothing on the user's objects ------------------------------------------------

def test_saving_copying_scripting_and_exporting_the_model_work_and_stay_clean(run_check):
    run = run_check("good_save_whole_model.py")
    assert_clean(run)
    assert "saved, scripted and exported" in run.output
    statuses = {c["id"]: c["status"] for c in run.report["checks"]}
    assert statuses["gradient-sync"] == statuses["buffer-sync"] == statuses["optimizer-params"] == "pass"


def test_a_bypass_after_all_that_is_still_seen(run_check):
    run = run_check("bad_grad_bypass_after_save.py")
    finding = root(run, "gradient-sync", "error", "good_save_whole_model.py", "model.module(x), y).backward()",
                   frozenset({"buffer-sync"}))
    assert finding["evidence"]["case"] == "ddp-bypassed"


# -- optimizer-params: updates below the weights' precision ----------------------------------------

def test_pure_bfloat16_weights_that_lose_their_updates_are_a_warning_naming_them(run_check):
    run = run_check("warn_bf16_pure_weights.py")
    finding = root(run, "optimizer-params", "warning", "warn_bf16_pure_weights.py", "optimizer = torch.optim.AdamW(")
    assert finding["evidence"]["case"] == "updates-below-precision"
    assert finding["evidence"]["parameters"] == ["norm1.weight", "norm2.weight"]
    assert run.returncode == 1
    assert_clean(run_check("good_bf16_autocast.py"))


# -- causes at their line ----------------------------------------------------------------------------

def test_a_backbone_frozen_when_ddp_was_built_names_the_wrap_and_the_unfreeze(run_check):
    run = run_check("bad_grad_frozen_at_wrap.py")
    finding = root(run, "gradient-sync", "error", "bad_grad_frozen_at_wrap.py", "layer.requires_grad_(True)")
    assert finding["evidence"]["case"] == "frozen-at-wrap"
    assert finding["evidence"]["wrapped_at"]["line"] == line_of("bad_grad_frozen_at_wrap.py",
                                                                 "model = DistributedDataParallel(net)")
    # The frozen backbone gets no gradient in the first epoch: DDP needs find_unused_parameters=True, said as info.
    assert_clean(run_check("good_freeze_unfreeze.py"), infos=frozenset({"unused-parameters"}))


def test_an_optimizer_state_restored_on_rank_0_only_is_the_root_at_the_load(run_check):
    run = run_check("bad_optimizer_state_rank0.py")
    finding = root(run, "config-sync", "error", "bad_optimizer_state_rank0.py", "optimizer.load_state_dict(checkpoint",
                   frozenset({"gradient-sync"}))
    assert finding["evidence"]["restored_on"] == [0] and finding["evidence"]["not_restored_on"] == [1]
    assert_clean(run_check("good_optimizer_state_every_rank.py"))


def test_a_device_round_trip_after_training_ended_is_fine(run_check):
    assert_clean(run_check("good_move_after_training.py"))
    bad = run_check("bad_grad_device_round_trip.py")
    finding = root(bad, "gradient-sync", "error", "bad_grad_device_round_trip.py", "model.cpu()")
    assert finding["evidence"]["case"] == "device-round-trip"


# -- patterns bench/realcode found -------------------------------------------------------------------

def test_local_sgd_is_info_and_local_steps_never_averaged_an_error(run_check):
    good = run_check("good_local_sgd.py")
    assert good.found() == {("gradient-sync", "info")}, good.findings()
    (finding,) = good.findings()
    assert finding["evidence"]["case"] == "periodic-averaging"
    assert finding["evidence"]["averaged_at"]["line"] == line_of("good_local_sgd.py", "dist.all_reduce(averaged)")
    assert good.returncode == 0
    bad = run_check("bad_grad_local_steps_never_averaged.py")
    finding = root(bad, "gradient-sync", "error", "good_local_sgd.py", "optimizer.step()")
    assert finding["evidence"]["case"] == "step-in-no-sync"
