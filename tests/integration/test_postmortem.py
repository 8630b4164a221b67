"""`ddpdoctor analyze` on real flight recorder dumps names the same root cause as `ddpdoctor check`.

Each fixture runs twice: under `ddpdoctor check`, and under plain torchrun with the recorder on and
the dump harness (tests/integration/fr_harness) writing dumps and error files the way NCCL's dump on
timeout and torchrun's `@record` do in production. `analyze` then reads that folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES, once_per_session

sys.path.insert(0, str(Path(__file__).resolve().parent / "fr_harness"))
from fr_launch import run_with_recorder  # noqa: E402

pytestmark = pytest.mark.integration

# fixture -> (ranks, `check` options, the bug's line (text on it), expected root (check, severity))
CASES = {
    "hang_rank_stuck_in_own_code.py": (2, ("--hang-timeout", "2"), None, ("collective-hang", "warning")),
    "hang_collective_some_ranks.py": (2, ("--hang-timeout", "5"), "dist.all_reduce(total)",
                                      ("collective-hang", "error")),
    "hang_reduce_shape_mismatch.py": (2, ("--hang-timeout", "5"), "dist.reduce(stats", ("collective-hang", "error")),
    "kill_rank.py": (2, (), None, ("rank-failure", "error")),  # test_hangs_and_faults' run
    "hang_subgroup_mismatch.py": (4, ("-n", "4", "--hang-timeout", "5"), "dist.reduce(stats",
                                  ("collective-hang", "error")),
}
# Where the two reports differ, by design: `check` stops a rank stuck in its own code itself (10x
# --hang-timeout), before any collective timed out, so nothing proves it would never have arrived (a
# warning); the recorded job ran until the watchdog's timeout expired, and its dumps prove the hang.
POST_MORTEM_ROOT = {"hang_rank_stuck_in_own_code.py": ("collective-hang", "error")}
# torchrun's options for a fixture's recorded run. kill_rank.py: rank 0 fails on its own once rank 1
# is killed (gloo's read error, its error file) before torchrun, which polls every 0.1 s by default,
# stops it with SIGTERM; on a loaded machine that default lost rank 0's error file in 1 of 12 and 1 of
# 24 runs, and 2 s in none of 24 (both beside 5 busy loops on 2 cores). Its victim is then always there.
RECORD_OPTIONS = {"kill_rank.py": {"monitor_interval_s": 2.0}}


@pytest.fixture
def recorded(tmp_path_factory):
    """``recorded(fixture, nproc)``: the folder of one plain-torchrun run of the fixture with the
    recorder on, made once per session and only read by the tests (``analyze`` writes elsewhere)."""

    def record(fixture: str, nproc: int = 2) -> Path:
        with once_per_session(tmp_path_factory, ("recorded", fixture, nproc)) as folder:
            dumps = folder / "dumps"
            if not (folder / "done").exists():
                run_with_recorder(fixture, dumps, nproc=nproc, **RECORD_OPTIONS.get(fixture, {}))
                (folder / "done").touch()
        return dumps

    return record


def _line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")


def _root(report: dict) -> dict:
    """The one top-level finding at warning or error of the checks a dump informs (collective-hang,
    rank-failure: `check` runs more), as the two reports must agree on it."""
    serious = [f for f in report["findings"] if f["severity"] in ("error", "warning")
               and f["check"] in ("collective-hang", "rank-failure")]
    assert len(serious) == 1, [(f["check"], f["message"]) for f in serious]
    finding = serious[0]
    location = finding["location"]
    evidence = finding["evidence"]
    return {"check": finding["check"], "severity": finding["severity"], "ranks": finding["ranks"],
            "culprit": evidence.get("rank") if finding["check"] == "rank-failure" else evidence.get("culprit"),
            "location": None if location is None else (os.path.basename(location["file"]), location["line"]),
            "collective": evidence.get("sequence"), "group": evidence.get("group"),
            "signal": evidence.get("signal"), "kind": evidence.get("kind")}


def analyze(*paths: Path, tmp_path: Path, extra: tuple = ()) -> tuple[int, Optional[dict], str]:
    report = tmp_path / "analyze.json"
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "analyze", *map(str, paths), "--json", str(report),
                           "--plain", *extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, data, proc.stdout + proc.stderr


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_analyze_names_the_root_cause_check_names(run_check, recorded, tmp_path, fixture):
    nproc, options, bug_line, expected = CASES[fixture]
    live = run_check(fixture, *options)
    assert live.report is not None, live.output[-3000:]
    dumps = recorded(fixture, nproc)
    code, post, output = analyze(dumps, tmp_path=tmp_path)
    assert code == 1 and post is not None, output[-3000:]
    assert post["launch_mode"] == "post-mortem" and post["world_size"] == nproc
    assert len([f for f in post["findings"] if f["severity"] != "info"]) == 1, output[-3000:]
    live_root, post_root = _root(live.report), _root(post)
    assert (live_root["check"], live_root["severity"]) == expected, live.output[-3000:]
    if fixture in POST_MORTEM_ROOT:
        assert (post_root["check"], post_root["severity"]) == POST_MORTEM_ROOT[fixture], output[-3000:]
        return
    assert post_root == live_root, (post_root, live_root, output[-3000:])
    if bug_line is not None:
        assert post_root["location"] == (fixture, _line_of(fixture, bug_line)), output[-3000:]


def test_stuck_rank_is_named_with_its_last_collective_and_line(recorded, tmp_path):
    dumps = recorded("hang_rank_stuck_in_own_code.py")
    code, post, output = analyze(dumps, tmp_path=tmp_path)
    (finding,) = post["findings"]
    assert "rank 1 is not inside a collective: stuck in its own code after _synthetic.py:" in finding["message"]
    states = finding["evidence"]["ranks"]
    assert states["0"]["state"] == "waiting" and "DDP's gradient all-reduce" in states["0"]["waiting_in"]
    assert states["1"]["state"] == "computing" and states["1"]["last_collective"]["n"] < finding["evidence"]["sequence"]
    assert "rank 1 never called collective" in finding["message"]


def test_a_rank_without_dump_is_named_and_the_kill_is_the_cause(recorded, tmp_path):
    dumps = recorded("kill_rank.py")
    assert not (dumps / "fr_trace_rank_1").exists()
    code, post, output = analyze(dumps, tmp_path=tmp_path)
    assert post["missing_ranks"] == [1]
    assert "no dump from rank 1" in post["post_mortem"]["notes"]
    (finding,) = post["findings"]
    assert finding["check"] == "rank-failure" and finding["ranks"] == [1]
    assert finding["evidence"]["signal"] == "SIGKILL"
    assert {s["rank"] for s in finding["evidence"]["secondary"]} == {0}  # its victim, kept apart
    # Without torchrun's failure table, only the dumps: rank 1 is missing, rank 0 failed after a peer left.
    code, only_dumps, output = analyze(dumps / "fr_trace_rank_0", tmp_path=tmp_path, extra=("--world-size", "2"))
    assert only_dumps["missing_ranks"] == [1]
    assert "no dump from rank 1" in only_dumps["post_mortem"]["notes"]


def test_a_victim_torchrun_stopped_before_it_raised_is_not_listed(recorded, tmp_path):
    """What CI once saw kill_rank.py leave under torchrun's default 0.1 s poll, made certain: rank 0
    (which catches its read error and waits) is stopped with SIGTERM before the error leaves its
    script, so it writes no error file and prints no traceback (the harness dumps on SIGTERM).
    Rank 1's kill is still the one cause, and rank 0 is listed as no victim."""
    dumps = recorded("kill_rank_slow_peer.py")
    assert not list(dumps.rglob("error.json"))
    code, post, output = analyze(dumps, tmp_path=tmp_path)
    assert code == 1 and post is not None, output[-3000:]
    assert post["missing_ranks"] == [1], output[-3000:]
    (finding,) = post["findings"]
    assert finding["check"] == "rank-failure" and finding["ranks"] == [1], output[-3000:]
    assert finding["evidence"]["signal"] == "SIGKILL" and finding["evidence"]["secondary"] == [], finding


def test_every_report_format_and_the_exit_codes(recorded, tmp_path):
    dumps = recorded("hang_collective_some_ranks.py")
    out = tmp_path / "out"
    code, post, output = analyze(dumps, tmp_path=tmp_path, extra=(
        "--junit", str(out / "junit.xml"), "--sarif", str(out / "r.sarif"), "--markdown", str(out / "r.md"),
        "--html", str(out / "r.html"), "--trace", str(out / "r.trace.json")))
    assert code == 1
    assert post["schema"] == "ddpdoctor.report/1" and post["outcome"] == "hung"
    assert "collective-hang" in (out / "junit.xml").read_text()
    sarif = json.loads((out / "r.sarif").read_text())
    assert sarif["runs"][0]["results"][0]["ruleId"] == "collective-hang"
    assert "collective-hang" in (out / "r.md").read_text()
    assert "collective-hang" in (out / "r.html").read_text()
    trace = json.loads((out / "r.trace.json").read_text())
    assert {e["args"]["sequence"] for e in trace["traceEvents"] if e.get("cat") == "collective"} >= set(range(1, 9))
    assert "ERROR collective-hang" in output and "verdict: NOT OK" in output
    code, _, _ = analyze(dumps, tmp_path=tmp_path, extra=("--exit-zero",))
    assert code == 0
    code, _, output = analyze(tmp_path / "nothing-here", tmp_path=tmp_path)
    assert code == 2 and "no such file or folder" in output


def test_check_keeps_its_ranks_dumps_and_analyze_agrees(run_check, tmp_path):
    live = run_check("hang_collective_some_ranks.py", "--hang-timeout", "5")  # its evidence kept (conftest)
    kept = Path(live.kept)
    assert sorted(p.name for p in kept.glob("fr_trace_rank_*")) == ["fr_trace_rank_0", "fr_trace_rank_1"]
    code, post, output = analyze(kept, tmp_path=tmp_path)
    assert code == 1 and _root(post) == _root(live.report), output[-3000:]
    assert post["script"].endswith("hang_collective_some_ranks.py")
