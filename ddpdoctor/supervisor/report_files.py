"""Where a finished report goes: the terminal, and any combination of JSON, JUnit, SARIF, Markdown,
HTML, a Chrome trace and GitHub Actions annotations with a step summary; torchrun's own log lines go
to a log file the report names.

:data:`RENDERERS` is the one table of report files: each row's flag, help and writer. The commands'
``--json``, ``--html``... options are declared from it (:mod:`ddpdoctor.supervisor.options`), and
:func:`write_all` writes from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Optional

from ddpdoctor.schema.findings import Severity

if TYPE_CHECKING:  # the renderers load only when a report is written (this table also declares the CLI flags)
    from rich.console import Console

    from ddpdoctor.analysis.report import Report


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


def _json(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.report import write_json

    write_json(report, path)


def _html(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.render.html import render_html

    _write(path, render_html(report, fail_on=fail_on))


def _trace(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.render.chrome_trace import render_trace

    _write(path, json.dumps(render_trace(report), separators=(",", ":")) + "\n")


def _junit(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.render.junit import render_junit

    _write(path, render_junit(report, fail_on=fail_on))


def _sarif(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.render.sarif import render_sarif

    _write(path, json.dumps(render_sarif(report, repo_root=repo_root()), indent=2) + "\n")


def _markdown(report: Report, path: str, fail_on: Severity) -> None:
    from ddpdoctor.analysis.render.markdown import render_markdown

    _write(path, render_markdown(report, fail_on=fail_on))


@dataclass(frozen=True)
class Renderer:
    """One report file: the option that asks for it (``--<name> PATH``), its help, and its writer."""

    name: str
    help: str
    write: Callable[["Report", str, Severity], None]

    @property
    def flag(self) -> str:
        return f"--{self.name}"


# In writing order: the JSON first, so nothing a later renderer does can lose it.
RENDERERS: tuple[Renderer, ...] = (
    Renderer("json", "Write the machine-readable report here.", _json),
    Renderer("html", "Write the report as one self-contained HTML page (timeline, step times, code; opens offline).",
             _html),
    Renderer("trace", "Write a Chrome trace (Perfetto, chrome://tracing): one track per rank.", _trace),
    Renderer("junit", "Write JUnit XML here (one testcase per check).", _junit),
    Renderer("sarif", "Write SARIF 2.1.0 here (code scanning).", _sarif),
    Renderer("markdown", "Write a Markdown summary here.", _markdown),
)
GITHUB_HELP = "GitHub Actions: annotations, and a summary in $GITHUB_STEP_SUMMARY."


def write_all(report: Report, *, console: Console, plain: bool, fail_on: Severity, files: Mapping[str, Optional[str]],
              github: bool) -> None:
    """Every file ``files`` asks for (renderer name -> path; None or absent: not written), then the
    terminal, then GitHub's annotations and step summary when ``github``."""
    from ddpdoctor.analysis.render import terminal

    unknown = set(files) - {r.name for r in RENDERERS}
    assert not unknown, f"no renderer for {sorted(unknown)}"
    write_launcher_log(report)
    for renderer in RENDERERS:  # the files first: nothing the terminal does can lose them
        path = files.get(renderer.name)
        if path:
            renderer.write(report, str(path), fail_on)
    terminal.render(console, report, plain=plain, fail_on=fail_on)
    if github:
        from ddpdoctor.analysis.render import github as github_format
        from ddpdoctor.analysis.render.markdown import render_markdown

        for line in github_format.annotations(report, repo_root=repo_root()):
            print(line, flush=True)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(render_markdown(report, fail_on=fail_on) + "\n")
