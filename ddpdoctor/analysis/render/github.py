"""GitHub Actions workflow commands: one annotation per top-level finding, on its source line, and
the stop-commands guard that keeps the user's script from printing annotations of its own."""

import secrets

from ddpdoctor.analysis.api import Finding
from ddpdoctor.analysis.render.sarif import relative_path
from ddpdoctor.analysis.report import Report

__all__ = ["escape_data", "escape_property", "annotation", "annotations", "new_stop_token", "stop_line",
           "resume_line"]

_COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    """A command's message: a raw newline would end the command, letting text inject another."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (file=, title=...): also ':' and ',', which delimit properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding, *, repo_root: str) -> str:
    properties = []
    if finding.location:
        file = relative_path(finding.location.file, repo_root) or finding.location.file
        properties += [f"file={escape_property(file)}", f"line={finding.location.line}"]
    properties.append(f"title={escape_property(f'ddpdoctor {finding.check}')}")
    lines = [finding.message]
    for consequence in finding.consequences:
        where = ""
        if consequence.location:
            file = relative_path(consequence.location.file, repo_root) or consequence.location.file
            where = f" at {file}:{consequence.location.line}"
        lines.append(f"consequence ({consequence.check}): {consequence.message}{where}")
    lines.append(f"fix: {finding.fix}")
    message = escape_data("\n".join(lines))
    return f"::{_COMMANDS[finding.severity]} {','.join(properties)}::{message}"


def annotations(report: Report, *, repo_root: str) -> list[str]:
    """Workflow command lines to print on stdout, files relative to ``repo_root`` ($GITHUB_WORKSPACE)."""
    lines = [annotation(f, repo_root=repo_root) for f in report.findings]
    if report.unchecked:
        lines.append(f"::error title={escape_property('ddpdoctor could not check the job')}::"
                     f"{escape_data(str(report.unchecked['reason']))}")
    return lines


def new_stop_token() -> str:
    """Unguessable, so the script cannot print the resume line itself."""
    return secrets.token_hex(16)


def stop_line(token: str) -> str:
    """Printed before the script runs: GitHub then ignores workflow commands until resume_line."""
    return f"::stop-commands::{token}"


def resume_line(token: str) -> str:
    return f"::{token}::"
