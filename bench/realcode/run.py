"""Run ddpdoctor over real public training scripts and compare each report with its adjudicated verdict.

The scripts are never copied into this repository: each case names a public GitHub repository, a
commit and paths, and the code is extracted at run time from a snapshot folder (the search tool's
`fetch`, default /work/.mirror). Adaptations (exact substring replacements) make a script run offline
on 2 CPU cores; a mutation plants one real bug. See README.md beside this file.

Stdlib only: it runs under any venv (`--python` picks the interpreter that runs ddpdoctor).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
CASES = HERE / "cases.toml"
# The realcode tier of tests/ (pyproject.toml's marker): real frameworks, and patterns of real code pinned as
# fixtures beside their twins. A plain `pytest` (CI) leaves it out for time; this bench runs it first.
PINNED_TESTS = ("-m", "pytest", "-m", "realcode", "-q", "-p", "no:cacheprovider")
PINNED_TESTS_TIMEOUT_S = 3600
DEFAULT_SNAPSHOTS = Path("/work/.mirror")
SEVERITIES = ("error", "warning", "info")
RANK = {"info": 0, "warning": 1, "error": 2}


class CannotRun(Exception):
    """The case could not be run for a reason outside ddpdoctor: missing snapshot, path, adaptation."""


@dataclass
class Case:
    id: str
    repo: str
    script: str
    style: str
    why: str
    expect: dict
    extract: list[str] = field(default_factory=lambda: ["."])
    cwd: str = "."
    args: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    adaptations: list[dict] = field(default_factory=list)
    mutation: dict | None = None
    needs: list[str] = field(default_factory=list)
    timeout: float | None = None

    @property
    def is_mutation(self) -> bool:
        return self.mutation is not None


@dataclass
class Result:
    case: Case
    verdict: str  # "ok" or a miss class
    got: dict[str, str] = field(default_factory=dict)
    got_info: dict[str, str] = field(default_factory=dict)
    outcome: str = ""
    note: str = ""
    wall_s: float = 0.0


# ---------------------------------------------------------------- cases


def load_cases(path: Path) -> tuple[dict[str, dict], list[Case]]:
    """Cases with `base` inherit everything from their base case but what they set themselves.

    A setup entry names a snippet of [setups] or is inline code; [setups]._prelude (helpers that
    generate inputs) runs before each.
    """
    data = tomllib.loads(path.read_text())
    repos: dict[str, dict] = data.get("repos", {})
    setups: dict[str, str] = data.get("setups", {})
    prelude = setups.pop("_prelude", "")
    raw: dict[str, dict] = {}
    cases: list[Case] = []
    for entry in data["case"]:
        merged = dict(raw[entry["base"]]) if "base" in entry else {}
        merged.pop("mutation", None)
        merged.update({k: v for k, v in entry.items() if k != "base"})
        raw[merged["id"]] = merged
        merged = dict(merged)
        merged["setup"] = [prelude + "\n" + setups.get(code, code) for code in merged.get("setup", [])]
        cases.append(Case(**merged))
    return repos, cases


# ---------------------------------------------------------------- snapshots


def git_dir(snapshots: Path, repo: str) -> Path:
    """The fetch tool lays a snapshot as OWNER+NAME/repo, a bare git directory or a tree with .git."""
    base = snapshots / repo.replace("/", "+")
    for candidate in (base / "repo" / ".git", base / "repo", base / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    raise CannotRun(f"snapshot of {repo} is absent under {snapshots} (fetch github:{repo})")


def git(gdir: Path, *args: str, binary: bool = False) -> bytes | str:
    proc = subprocess.run(["git", f"--git-dir={gdir}", *args], capture_output=True)
    if proc.returncode != 0:
        raise CannotRun(f"git {' '.join(args)} failed in {gdir}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout if binary else proc.stdout.decode()


def resolve_commit(gdir: Path, repo: str, commit: str | None) -> tuple[str, str]:
    """The recorded commit when the snapshot has it, else HEAD, with a note that says so."""
    if commit:
        probe = subprocess.run(["git", f"--git-dir={gdir}", "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True)
        if probe.returncode == 0:
            return commit, ""
    head = str(git(gdir, "rev-parse", "HEAD")).strip()
    why = f"commit {commit[:12]} is not in the snapshot of {repo}" if commit else f"no commit recorded for {repo}"
    return head, f"{why}; used HEAD {head[:12]}"


def extract(gdir: Path, commit: str, paths: list[str], dest: Path, repo: str) -> str:
    """`git archive` of the named subtrees; a path gone from that commit is said, not crashed on.

    Snapshots lack files of 4 MiB and more (and LFS content): when the archive fails on such a
    missing blob, the readable files are extracted one by one and the note says how many are absent.
    """
    for path in paths:
        if path in (".", ""):
            continue
        listed = str(git(gdir, "ls-tree", commit, "--", path.rstrip("/"))).strip()
        if not listed:
            raise CannotRun(f"{repo}: path {path!r} is not at commit {commit[:12]}")
    try:
        archive = git(gdir, "archive", "--format=tar", commit, "--", *paths, binary=True)
    except CannotRun:
        return extract_blobs(gdir, commit, paths, dest)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return ""


def extract_blobs(gdir: Path, commit: str, paths: list[str], dest: Path) -> str:
    """File by file through `git cat-file --batch`, skipping blobs the snapshot does not hold."""
    listing = str(git(gdir, "ls-tree", "-r", "-z", commit, "--", *[p for p in paths if p not in (".", "")]))
    entries = [line.split("\t", 1) for line in listing.split("\0") if line]
    blobs = [(meta.split()[2], path) for meta, path in entries if meta.split()[1] == "blob"]
    batch = subprocess.run(["git", f"--git-dir={gdir}", "cat-file", "--batch"], capture_output=True,
                           input="".join(f"{sha}\n" for sha, _ in blobs).encode())
    out, pos, absent = batch.stdout, 0, []
    for sha, path in blobs:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].decode()
        pos = header_end + 1
        if header.endswith("missing"):
            absent.append(path)
            continue
        size = int(header.split()[2])
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(out[pos:pos + size])
        pos += size + 1
    return f"{len(absent)} file(s) absent from the snapshot (e.g. {absent[0]})" if absent else ""


def apply_edit(root: Path, edit: dict, kind: str) -> None:
    """An exact substring replacement that must match as declared (count, default 1)."""
    target = root / edit["file"]
    if not target.is_file():
        raise CannotRun(f"{kind} did not apply: {edit['file']} is not in the extracted tree")
    text = target.read_text()
    expected = edit.get("count", 1)
    found = text.count(edit["old"])
    if found != expected:
        raise CannotRun(f"{kind} did not apply: {edit['file']}: {edit['old']!r} found {found} time(s), "
                        f"declared {expected}")
    target.write_text(text.replace(edit["old"], edit["new"]))


def prepare(case: Case, repos: dict[str, dict], snapshots: Path, work: Path) -> str:
    """Extract, adapt, mutate and generate inputs in `work`; returns a note (commit fallback) or ''."""
    gdir = git_dir(snapshots, case.repo)
    commit, note = resolve_commit(gdir, case.repo, repos.get(case.repo, {}).get("commit"))
    absent = extract(gdir, commit, case.extract, work, case.repo)
    note = "; ".join(n for n in (note, absent) if n)
    for edit in case.adaptations:
        apply_edit(work, edit, "adaptation")
    if case.mutation:
        apply_edit(work, case.mutation, "mutation")
    return note


def run_setup(case: Case, python: str, work: Path) -> None:
    """Generated inputs (token files, tiny tokenizers, json data): Python snippets run in the work dir."""
    for code in case.setup:
        proc = subprocess.run([python, "-c", code], cwd=work / case.cwd, capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            raise CannotRun(f"setup failed: {proc.stderr.strip().splitlines()[-1:]}")


def check_needs(python: str, needs: list[str], cache: dict[str, bool]) -> None:
    for module in needs:
        if module not in cache:
            proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
            cache[module] = proc.returncode == 0
        if not cache[module]:
            raise CannotRun(f"needs `{module}`, which {python} cannot import (see README: the realcode venv)")


# ---------------------------------------------------------------- running and judging


def run_doctor(case: Case, python: str, work: Path, out: Path, timeout: float) -> tuple[int, float]:
    report = out / "report.json"
    cmd = [python, "-m", "ddpdoctor", "check", case.script, "--plain", "--json", str(report),
           *case.options, *(["--", *case.args] if case.args else [])]
    env = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           # a cache per case: the datasets cache keys local data by relative path, so cases would share it
           "HF_DATASETS_CACHE": str(work / ".cache" / "datasets"), "HF_MODULES_CACHE": str(work / ".cache" / "modules"),
           **case.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / case.cwd), env.get("PYTHONPATH", "")) if p)
    (out / "command.txt").write_text(" ".join(cmd) + f"\n(cwd {work / case.cwd})\n")
    start = time.monotonic()
    with open(out / "output.txt", "w") as log:
        try:
            proc = subprocess.Popen(cmd, cwd=work / case.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -1
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the ranks and spawned workers go too
            proc.wait()
            log.write(f"\n[realcode] ddpdoctor did not finish within {timeout:.0f} s\n")
    return code, time.monotonic() - start


def findings_of(report: dict) -> tuple[dict[str, str], dict[str, str], set[str]]:
    """Top-level warning/error findings and info findings as {check: worst severity}, and consequence checks."""
    top: dict[str, str] = {}
    info: dict[str, str] = {}
    consequences: set[str] = set()
    for finding in report.get("findings", []):
        bucket = info if finding["severity"] == "info" else top
        check, severity = finding["check"], finding["severity"]
        if RANK[severity] >= RANK.get(bucket.get(check, "info"), 0):
            bucket[check] = severity
        consequences.update(c["check"] for c in finding.get("consequences", []))
    return top, info, consequences


def classify(case: Case, top: dict[str, str], info: dict[str, str], consequences: set[str],
             outcome: str) -> str:
    """ok, or the miss class: a false error is the worst, so it wins over every other class."""
    expected: dict[str, str] = case.expect.get("findings", {})
    missing = {c: s for c, s in expected.items() if RANK.get(top.get(c, ""), -1) < RANK[s]}
    extra = {c: s for c, s in top.items() if RANK[s] > RANK.get(expected.get(c, ""), -1)}
    if missing:
        if extra or consequences & set(missing):
            return "wrong-root"
        return "missed-bug"
    if any(s == "error" for s in extra.values()):
        return "false-positive-error"
    if extra:
        return "false-positive-warning"
    if case.expect.get("outcome", "completed") != outcome:
        return "wrong-outcome"
    if "info" in case.expect and case.expect["info"] != info:
        return "info-differs"
    return "ok"


def crash_is_environmental(top: dict[str, str], case: Case, outcome: str) -> bool:
    """A crash where none was expected, and nothing but the crash found: the script could not run here."""
    return (outcome in ("failed", "timeout") and case.expect.get("outcome", "completed") == "completed"
            and set(top) - set(case.expect.get("findings", {})) <= {"rank-failure"})


def first_error_line(report: dict) -> str:
    for finding in report.get("findings", []):
        if finding["check"] == "rank-failure":
            return finding["message"][:200]
    return ""


def judge(case: Case, out: Path, code: int) -> Result:
    report_path = out / "report.json"
    if not report_path.is_file():
        output = out / "output.txt"
        tail = output.read_text(errors="replace").strip().splitlines()[-1:] if output.is_file() else []
        return Result(case, "could-not-run", note=f"no report (ddpdoctor exit {code}): {' '.join(tail)[:200]}")
    report = json.loads(report_path.read_text())
    top, info, consequences = findings_of(report)
    outcome = report.get("outcome", "")
    if crash_is_environmental(top, case, outcome):
        return Result(case, "could-not-run", top, info, outcome, note=first_error_line(report))
    return Result(case, classify(case, top, info, consequences, outcome), top, info, outcome)


def run_case(case: Case, repos: dict[str, dict], args: argparse.Namespace, needs_cache: dict[str, bool]) -> Result:
    out = args.out / case.id.replace("/", "__")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="realcode-"))
    try:
        check_needs(args.python, case.needs, needs_cache)
        note = prepare(case, repos, args.snapshots, work)
        run_setup(case, args.python, work)
        code, wall = run_doctor(case, args.python, work, out, case.timeout or args.timeout)
        result = judge(case, out, code)
        result.wall_s = wall
        result.note = "; ".join(n for n in (note, result.note) if n)
        return result
    except CannotRun as exc:
        (out / "output.txt").write_text(f"[realcode] could not run: {exc}\n")
        return Result(case, "could-not-run", note=str(exc))
    finally:
        if args.keep_work:
            shutil.copytree(work, out / "work", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.bin", "*.pt"))
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- output


def fmt(findings: dict[str, str]) -> str:
    return ", ".join(f"{c}:{s}" for c, s in sorted(findings.items())) or "no warning/error"


def print_table(results: list[Result]) -> None:
    rows = [["case", "expected", "got", "verdict"]]
    for r in results:
        exp = fmt(r.case.expect.get("findings", {}))
        exp_outcome = r.case.expect.get("outcome", "completed")
        got = f"{fmt(r.got)} [{r.outcome}]" if r.outcome else "-"
        rows.append([r.case.id, f"{exp} [{exp_outcome}]", got, r.verdict])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_misses(results: list[Result]) -> None:
    misses = [r for r in results if r.verdict != "ok"]
    if not misses:
        return
    print("\nmisses:")
    for r in misses:
        line = f"  {r.verdict:24} {r.case.id}"
        if r.note:
            line += f": {r.note}"
        print(line)


def save_summary(results: list[Result], out: Path) -> None:
    rows = [{"case": r.case.id, "repo": r.case.repo, "script": r.case.script, "mutation": r.case.is_mutation,
             "expected": r.case.expect, "got": r.got, "got_info": r.got_info, "outcome": r.outcome,
             "verdict": r.verdict, "note": r.note, "wall_s": round(r.wall_s, 1)} for r in results]
    (out / "summary.json").write_text(json.dumps(rows, indent=1))


def list_cases(cases: list[Case], repos: dict[str, dict]) -> None:
    for case in cases:
        commit = repos.get(case.repo, {}).get("commit", "?")[:10]
        kind = "mutation" if case.is_mutation else "real"
        print(f"{case.id:52} {case.repo}@{commit} {case.script}  [{kind}] {case.style}")
    print(f"\n{len(cases)} cases, {len({c.repo for c in cases})} repositories, "
          f"{len({(c.repo, c.script) for c in cases})} scripts, {sum(c.is_mutation for c in cases)} mutations")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="fnmatch pattern on case ids (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs ddpdoctor and the scripts")
    parser.add_argument("--snapshots", type=Path, default=DEFAULT_SNAPSHOTS, help="folder of fetched snapshots")
    parser.add_argument("--out", type=Path, default=None, help="per-case reports and output (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per case unless the case says")
    parser.add_argument("--cases", type=Path, default=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--keep-work", action="store_true", help="copy each adapted work tree into the output")
    parser.add_argument("--no-tests", action="store_true",
                        help="skip the realcode tier of tests/ (`pytest -m realcode`), which a run without --only "
                             "runs first with --python's pytest")
    return parser.parse_args(argv)


def run_pinned_tests(python: str, out: Path) -> tuple[bool, str]:
    """Runs the realcode tier of the checkout's tests with ``python``'s pytest (the test extras installed beside
    ddpdoctor); returns whether it passed and pytest's last line. Its whole output goes to pinned-tests.log."""
    log = out / "pinned-tests.log"
    try:
        proc = subprocess.run([python, *PINNED_TESTS], cwd=CHECKOUT, capture_output=True, text=True,
                              timeout=PINNED_TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        log.write_text(f"{e.stdout or ''}{e.stderr or ''}")
        return False, f"timed out after {PINNED_TESTS_TIMEOUT_S} s"
    except OSError as e:
        return False, f"could not start {python}: {e}"
    log.write_text(proc.stdout + proc.stderr)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return proc.returncode == 0, (lines[-1].strip("= ") if lines else f"exit {proc.returncode}, no output")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repos, cases = load_cases(args.cases)
    if args.only:
        cases = [c for c in cases if any(fnmatch.fnmatch(c.id, p) or p in c.id for p in args.only)]
    if args.list:
        list_cases(cases, repos)
        return 0
    args.out = (args.out or Path(tempfile.mkdtemp(prefix="realcode-out-"))).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"realcode: {len(cases)} case(s), python {args.python}, snapshots {args.snapshots}, out {args.out}",
          flush=True)
    tests_passed, tests_said = True, None  # the realcode tier of tests/: whether it passed, and what it said
    if not (args.only or args.no_tests):
        print("  the realcode tier of tests/ (pytest -m realcode) ...", flush=True)
        tests_passed, last_line = run_pinned_tests(args.python, args.out)
        tests_said = f"{'passed' if tests_passed else 'FAILED'}: {last_line}"
        print(f"  {tests_said} (output in {args.out / 'pinned-tests.log'})", flush=True)
    results: list[Result] = []
    needs_cache: dict[str, bool] = {}
    for case in cases:
        result = run_case(case, repos, args, needs_cache)
        results.append(result)
        print(f"  {result.verdict:24} {case.id} ({result.wall_s:.0f} s) got {fmt(result.got)} [{result.outcome}]"
              + (f" - {result.note}" if result.note else ""), flush=True)
        save_summary(results, args.out)
    print()
    print_table(results)
    print_misses(results)
    ok = sum(r.verdict == "ok" for r in results)
    print(f"\n{ok}/{len(results)} as expected (reports in {args.out})")
    if tests_said:
        print(f"realcode tier of tests/: {tests_said}")
    return 0 if ok == len(results) and tests_passed else 1


if __name__ == "__main__":
    sys.exit(main())
