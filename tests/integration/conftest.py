"""Integration harness: runs ddpdoctor on fixtures under real torchrun (2 gloo ranks on CPU)."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from ci_gate import skip_or_fail_in_ci  # noqa: F401  (the integration tests import it from here)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
OUR_MODULES = ("ddpdoctor/rank/bootstrap.py", "ddpdoctor/rank/agent.py", "ddpdoctor check", "-m ddpdoctor")


# What torch itself leaves in the temporary directory of any process that imports torch._dynamo
# (plain torchrun too): its compile cache, not the script's or ddpdoctor's.
TORCH_CACHES = ("torchinductor_",)


def ddpdoctors_own(temp_left: list[str]) -> list[str]:
    """Of the names a run left in its temporary directory, ddpdoctor's own (``ddpdoctor-*`` evidence
    folders, the ``ddpdoctor`` folder of kept torchrun logs)."""
    return [name for name in temp_left if name.startswith("ddpdoctor")]


@dataclass
class CheckRun:
    returncode: int
    output: str
    report: Optional[dict]
    wall_s: float
    temp_left: list[str] = dataclasses.field(default_factory=list)  # names left in the run's TMPDIR
    kept: Optional[str] = None  # the --keep-evidence folder of a run of a fixture in KEEPS_EVIDENCE

    def left_behind(self) -> list[str]:
        """What the run (ddpdoctor, the script) left in its temporary directory, torch's caches aside."""
        return [name for name in self.temp_left if not name.startswith(TORCH_CACHES)]

    def findings(self, check: Optional[str] = None, severity: Optional[str] = None) -> list[dict]:
        found = self.report["findings"] if self.report else []
        return [f for f in found if (check is None or f["check"] == check)
                and (severity is None or f["severity"] == severity)]

    def severities(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for f in self.findings():
            out.setdefault(f["check"], set()).add(f["severity"])
        return out

    def serious(self) -> list[dict]:
        return [f for f in self.findings() if f["severity"] in ("error", "warning")]

    def roots(self) -> dict[str, str]:
        """{check: severity} of the top-level findings at warning or error. One bug, one finding: two
        roots of one check at one severity (the same cause reported twice) fail here, whatever the
        test expects."""
        pairs = [(f["check"], f["severity"]) for f in self.serious()]
        twice = sorted({pair for pair in pairs if pairs.count(pair) > 1})
        assert not twice, f"more than one root finding of {twice}: {[f['message'] for f in self.serious()]}"
        return dict(pairs)

    def found(self) -> set[tuple[str, str]]:
        """Every top-level finding as (check, severity), info included; duplicates fail as in roots()."""
        self.roots()
        return {(f["check"], f["severity"]) for f in self.findings()}

    def consequences(self, root: Optional[str] = None) -> list[dict]:
        """Consequences attached to the top-level findings (of check ``root`` only, if given)."""
        return [c for f in self.findings(root) for c in f["consequences"]]

    def anywhere(self, check: str, severity: Optional[str] = None) -> list[dict]:
        """Findings of ``check``, top-level or attached as a consequence."""
        found = self.findings(check) + [c for c in self.consequences() if c["check"] == check]
        return [f for f in found if severity is None or f["severity"] == severity]


# Every process this test session starts inherits this marker, so the leftover check finds this
# session's orphans (reparented to init) and never touches another session's processes.
SESSION_MARKER = f"DDPDOCTOR_TEST_SESSION={os.getpid()}"
os.environ["DDPDOCTOR_TEST_SESSION"] = str(os.getpid())


def _ours(pid: int) -> bool:
    """Started by this test session: its environment carries the session's marker."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARKER.encode() in f.read().split(b"\0")
    except OSError:
        return False


def our_processes() -> list[str]:
    """Command lines of live ddpdoctor processes (agents, ranks, supervisors) this session started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(m in cmdline for m in OUR_MODULES) and _ours(int(entry)):
            found.append(f"{entry}: {cmdline}")
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every integration test must leave no rank, agent or supervisor behind."""
    yield
    deadline = time.monotonic() + 5
    while our_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = our_processes()
    for line in leftovers:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert not leftovers, f"processes left behind: {leftovers}"


def ddpdoctor_command(script: Optional[Path], json_path: Path, *options: str, script_args=()) -> list[str]:
    cmd = [sys.executable, "-m", "ddpdoctor", "check"]
    if script is not None:
        cmd.append(str(script))
    cmd += ["--json", str(json_path), "--plain", *options]
    if script_args:
        cmd += ["--", *script_args]
    return cmd


_RUNS: dict[tuple, CheckRun] = {}
# Fixtures whose runs keep their evidence (--keep-evidence): tests analyze their ranks' dumps afterwards.
KEEPS_EVIDENCE = {"hang_rank_stuck_in_own_code.py", "hang_collective_some_ranks.py"}


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session sees (the workers' base folders share a parent)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def once_per_session(tmp_path_factory: pytest.TempPathFactory, key: tuple) -> Iterator[Path]:
    """Yields the session-wide folder of ``key``, locked: the first worker to ask makes its content,
    a worker asking meanwhile waits, and later ones find it made."""
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:24]
    folder = shared_dir(tmp_path_factory, "shared-runs") / digest
    folder.mkdir(exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def run_check(tmp_path, tmp_path_factory):
    """Run ``ddpdoctor check`` on a fixture (None: the reference job) and parse its JSON report.

    Runs are deterministic in what they report, so one run per (fixture, options, arguments) is
    shared by every test that asserts on it, in every pytest-xdist worker: the suite stays within
    CI's time budget. A run whose options name a test's own tmp_path is that test's alone.
    A run of a fixture in ``KEEPS_EVIDENCE`` keeps its evidence in the run's session-wide folder
    (``run.kept``, to read only), so the tests of its kept files share it with those of its report.
    """

    def run(name: Optional[str], *options: str, script_args=(), timeout: float = 240) -> CheckRun:
        key = (name, options, tuple(script_args))
        if key not in _RUNS:
            with once_per_session(tmp_path_factory, ("check", *key)) as folder:
                saved = folder / "run.json"
                if saved.exists():
                    _RUNS[key] = CheckRun(**json.loads(saved.read_text()))
                else:
                    kept = str(folder / "kept") if name in KEEPS_EVIDENCE else None
                    extra = ("--keep-evidence", kept) if kept else ()
                    _RUNS[key] = dataclasses.replace(_run(tmp_path, name, (*options, *extra), script_args, timeout),
                                                     kept=kept)
                    saved.write_text(json.dumps(dataclasses.asdict(_RUNS[key])))
        return _RUNS[key]

    return run


@contextmanager
def run_tmpdir() -> Iterator[tuple[Path, list[str]]]:
    """A temporary directory of one run's own, to pass as its TMPDIR (short: multiprocessing makes
    AF_UNIX sockets there), and the list of the names the run left in it, filled when the block
    ends; the directory is then removed, so fixture runs leave nothing in /tmp."""
    folder, left = Path(tempfile.mkdtemp(prefix="ddpdoctor-test-run-")), []
    try:
        yield folder, left
        left.extend(sorted(p.name for p in folder.iterdir()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(tmp_path: Path, name: Optional[str], options: tuple, script_args, timeout: float) -> CheckRun:
    script = None if name is None else (FIXTURES / name if not os.path.isabs(name) else Path(name))
    json_path = tmp_path / "report.json"
    started = time.monotonic()
    with run_tmpdir() as (temp, left):
        env = {**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": str(temp)}
        proc = subprocess.run(ddpdoctor_command(script, json_path, *options, script_args=script_args),
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    report = json.loads(json_path.read_text()) if json_path.exists() else None
    return CheckRun(proc.returncode, proc.stdout + proc.stderr, report, time.monotonic() - started, left)


@dataclass
class InsideRun:
    """``torchrun --nproc-per-node 2 -m ddpdoctor check`` (an existing launch), run with ``-q`` and
    ``--keep-evidence``: what the tests read is torchrun's exit code, rank 0's output, the report
    and the evidence files kept."""
    returncode: int
    stdout: str
    report: Optional[dict]
    evidence: list[str]
    temp_left: list[str]  # names left in the run's TMPDIR (torchrun's own torchelastic_* among them)


@pytest.fixture
def run_inside_launch(tmp_path_factory):
    """Run a fixture inside an existing torchrun launch, once per (fixture, options) for the whole
    session, like ``run_check``."""

    def run(name: str, *options: str) -> InsideRun:
        with once_per_session(tmp_path_factory, ("inside", name, options)) as folder:
            saved = folder / "run.json"
            if not saved.exists():
                report, evidence = folder / "report.json", folder / "evidence"
                with run_tmpdir() as (temp, left):
                    proc = subprocess.run(
                        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                         "ddpdoctor", "check", str(FIXTURES / name), "--json", str(report), "--plain", "-q",
                         "--keep-evidence", str(evidence), *options],
                        cwd=folder, env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True,
                        timeout=240)
                saved.write_text(json.dumps(dataclasses.asdict(InsideRun(
                    proc.returncode, proc.stdout, json.loads(report.read_text()) if report.exists() else None,
                    sorted(p.name for p in evidence.iterdir()) if evidence.is_dir() else [], left))))
            return InsideRun(**json.loads(saved.read_text()))

    return run
