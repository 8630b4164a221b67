"""The command line on bad input, the reference job, and the three launch modes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration


def ddpdoctor(*args: str, cwd, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, fragment", [
    (["check", "does_not_exist.py"], "script not found"),
    (["check", "."], "is a directory"),
    (["check", "syntax_error.py"], "syntax error"),
    (["check", "--no-such-flag"], "No such option"),
    (["check", "--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
    (["check", "--fail-on", "sometimes"], "--fail-on"),
    (["explain", "no-such-check"], "unknown check id"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    (tmp_path / "syntax_error.py").write_text("def broken(:\n")
    proc = ddpdoctor(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error:") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_script_options_without_separator_get_a_hint(tmp_path):
    proc = ddpdoctor("check", str(FIXTURES / "reference.py"), "--epochs", "1", cwd=tmp_path)
    assert proc.returncode == 2
    assert "after --" in proc.stderr


def test_list_explain_and_version(tmp_path):
    listed = ddpdoctor("list-checks", cwd=tmp_path)
    ids = [line.split()[0] for line in listed.stdout.splitlines()]
    assert ids == ["gradient-sync", "buffer-sync", "sampler-disjoint", "set-epoch", "unused-parameters",
                   "collective-hang", "uneven-inputs", "rank0-checkpoint", "rank-failure", "not-distributed",
                   "env-consistency", "collective-bandwidth", "config-sync", "optimizer-params", "global-batch"]
    explained = ddpdoctor("explain", "set-epoch", cwd=tmp_path)
    assert explained.returncode == 0
    for section in ("What it does", "Why it matters", "Example", "Use instead"):
        assert section in explained.stdout
    assert ddpdoctor("--version", cwd=tmp_path).stdout.startswith("ddpdoctor ")


def test_reference_job_is_clean(run_check):
    run = run_check(None, script_args=("--epochs", "1"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set(), run.findings()
    assert run.report["schema"] == "ddpdoctor.report/1"
    assert run.report["script"] is None and run.report["outcome"] == "completed"
    assert all(c["status"] in ("pass", "skip") for c in run.report["checks"])
    assert {c["id"]: c["status"] for c in run.report["checks"]}["gradient-sync"] == "pass"
    assert "[rank0] epoch 0" in run.output, "the script's own output stays visible, prefixed by rank"
    assert run.left_behind() == [], "neither the reference job nor ddpdoctor leaves anything in the temporary directory"
    # The smoke test: every rank's environment, and the collective sweep (gloo on CPU: 8 B to 4 MiB).
    assert [e["rank"] for e in run.report["environment"]] == [0, 1]
    assert all(e["torch"] and e["python"] and e["host"] for e in run.report["environment"])
    bench = run.report["collective_benchmark"]
    assert (bench["backend"], bench["device"], bench["world_size"]) == ("gloo", "cpu", 2)
    assert {r["op"] for r in bench["rows"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert {r["bytes"] for r in bench["rows"]} >= {8, 4 << 20}
    assert all(r["time_us"] > 0 and r["busbw_gbps"] >= 0 and r["slowest_rank"] in (0, 1) for r in bench["rows"])
    assert "collective benchmark: gloo on cpu, 2 ranks" in run.output and "busbw" in run.output


def test_spawn_mode_probes_every_worker(run_check):
    run = run_check("spawn_reference.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set(), run.findings()
    assert run.report["launch_mode"] == "spawn"
    assert run.report["world_size"] == 2
    assert {c["id"]: c["status"] for c in run.report["checks"]}["gradient-sync"] == "pass"


def test_spawn_mode_catches_a_bug_in_the_workers(run_check, tmp_path):
    script = tmp_path / "spawn_bypass.py"
    source = (FIXTURES / "spawn_reference.py").read_text()
    assert "loss_fn(model(x), y)" in source
    script.write_text(source.replace("loss_fn(model(x), y)", "loss_fn(model.module(x), y)"))
    (tmp_path / "_synthetic.py").write_text((FIXTURES / "_synthetic.py").read_text())
    run = run_check(str(script))
    assert run.returncode == 1
    (finding,) = run.findings("gradient-sync", "error")
    assert finding["evidence"]["case"] == "ddp-bypassed"


def test_inside_an_existing_torchrun_launch(run_inside_launch):
    # the same run as test_pipeline's comparison with the launched one
    run = run_inside_launch("bad_grad_bypass_batchnorm.py")
    assert run.report["launch_mode"] == "existing-launch"
    assert run.report["world_size"] == 2
    assert [f["check"] for f in run.report["findings"] if f["severity"] == "error"] == ["gradient-sync"]
    assert run.returncode != 0  # rank 0 exits 1 for the finding; torchrun reports it


def test_hang_inside_an_existing_launch_goes_through_the_store(run_inside_launch):
    run = run_inside_launch("hang_barrier_rank0.py", "--hang-timeout", "5")
    assert run.returncode != 0
    assert run.report["outcome"] == "hung"
    (finding,) = [f for f in run.report["findings"] if f["check"] == "collective-hang"]
    assert finding["severity"] == "error"
    assert finding["location"]["file"].endswith("hang_barrier_rank0.py")
    assert finding["evidence"]["ranks"]["0"]["where"]["function"] == "validate"
    assert "[rank0]" not in run.stdout, "-q hides the script's output in this mode too"
    assert len(run.evidence) >= 2 and all(name.startswith("events-") for name in run.evidence), run.evidence


def test_a_spawn_guess_corrected_when_the_script_reads_torchruns_environment(run_check):
    """The source calls mp.spawn, but only when asked: without the flag the launcher process sets up
    its process group from torchrun's variables, and ddpdoctor starts the job again under torchrun."""
    run = run_check("good_spawn_when_asked.py")
    assert run.returncode == 0, run.output[-3000:]
    assert run.found() == set(), run.findings()
    assert run.report["launch_mode"] == "torchrun" and run.report["world_size"] == 2
    assert "set up its process group from torchrun's environment at good_spawn_when_asked.py:" \
        in run.report["launch"]["detected"]
    assert "starting it again under torchrun" in run.output
    spawned = run_check("good_spawn_when_asked.py", script_args=("--multiprocessing-distributed",))
    assert spawned.returncode == 0, spawned.output[-3000:]
    assert spawned.found() == set(), spawned.findings()
    assert spawned.report["launch_mode"] == "spawn" and "detected" not in spawned.report["launch"]
