"""Where a finished report goes: the terminal, and any combination of JSON, JUnit, SARIF, Markdown,
HTML, a Chrome trace and GitHub Actions annotations with a step summary; torchrun's own log lines go
to a log file the report names."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from typing import Iterator, Optional

from rich.console import Console

from ddpdoctor.analysis.render import terminal
from ddpdoctor.analysis.report import Report, write_json


def repo_root(start: Optional[str] = None) -> str:
    """What SARIF and annotations make paths relative to: $GITHUB_WORKSPACE, else the enclosing
    git checkout, else the current directory."""
    if os.environ.get("GITHUB_WORKSPACE"):
        return os.environ["GITHUB_WORKSPACE"]
    directory = os.path.abspath(start or os.getcwd())
    while True:
        if os.path.exists(os.path.join(directory, ".git")):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return os.path.abspath(start or os.getcwd())
        directory = parent


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def github_command_guard(*, enabled: bool) -> Iterator[None]:
    """While the script runs, GitHub ignores workflow commands in its output (::stop-commands::)."""
    if not enabled:
        yield
        return
    from ddpdoctor.analysis.render import github as github_format

    token = github_format.new_stop_token()
    print(github_format.stop_line(token), flush=True)
    try:
        yield
    finally:
        print(github_format.resume_line(token), flush=True)


def launcher_log_path(report: Report) -> str:
    """Where torchrun's own log lines of this run go: the temporary directory, named by time and pid."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(tempfile.gettempdir(), "ddpdoctor", f"torchrun-{stamp}-{os.getpid()}.log")


def write_launcher_log(report: Report) -> None:
    """torchrun's log lines (kept off the screen) into a file the report names; once per report."""
    if not report.launcher_log or report.launcher_log_path:
        return
    path = launcher_log_path(report)
    try:
        _write(path, "\n".join(report.launcher_log) + "\n")
    except OSError:
        return  # the lines stay in the JSON report
    report.launcher_log_path = path


def write_all(report: Report, *, console: Console, plain: bool, fail_on: str, json_path: Optional[str],
              junit: Optional[str], sarif: Optional[str], markdown: Optional[str], github: bool,
              html: Optional[str] = None, trace: Optional[str] = None) -> None:
    root = repo_root()
    write_launcher_log(report)
    if json_path:  # the files first: nothing the terminal does can lose them
        write_json(report, json_path)
    if html:
        from ddpdoctor.analysis.render.html import render_html

        _write(html, render_html(report, fail_on=fail_on))
    if trace:
        from ddpdoctor.analysis.render.chrome_trace import render_trace

        _write(trace, json.dumps(render_trace(report), separators=(",", ":")) + "\n")
    if junit:
        from ddpdoctor.analysis.render.junit import render_junit

        _write(junit, render_junit(report, fail_on=fail_on))
    if sarif:
        from ddpdoctor.analysis.render.sarif import render_sarif

        _write(sarif, json.dumps(render_sarif(report, repo_root=root), indent=2) + "\n")
    if markdown:
        from ddpdoctor.analysis.render.markdown import render_markdown

        _write(markdown, render_markdown(report, fail_on=fail_on))
    terminal.render(console, report, plain=plain, fail_on=fail_on)
    if github:
        from ddpdoctor.analysis.render import github as github_format
        from ddpdoctor.analysis.render.markdown import render_markdown

        for line in github_format.annotations(report, repo_root=root):
            print(line, flush=True)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(render_markdown(report, fail_on=fail_on) + "\n")
