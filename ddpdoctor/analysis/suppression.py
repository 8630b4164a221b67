"""Inline suppression: `# ddpdoctor: ignore[check-id] reason` on the line a finding points at.

A suppressed finding is not dropped: the report lists it with its reason. A suppression comment
that matched no finding is listed too, so stale ones get noticed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from ddpdoctor.analysis.api import Finding

__all__ = ["Suppression", "parse", "scan_files", "apply"]

_COMMENT = re.compile(r"#\s*ddpdoctor:\s*ignore\[([^\]]*)\]\s*(.*)$")


@dataclass(frozen=True)
class Suppression:
    file: str
    line: int
    checks: tuple[str, ...]
    reason: str

    def matches(self, finding: Finding) -> bool:
        return (finding.location is not None and finding.location.file == self.file
                and finding.location.line == self.line and finding.check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "checks": list(self.checks), "reason": self.reason}


def parse(file: str, lines: Iterable[str]) -> list[Suppression]:
    """The suppression comments in one file's lines (1-based line numbers)."""
    found = []
    for number, text in enumerate(lines, start=1):
        match = _COMMENT.search(text)
        if match:
            checks = tuple(c.strip() for c in match.group(1).split(",") if c.strip())
            found.append(Suppression(file=file, line=number, checks=checks, reason=match.group(2).strip()))
    return found


def scan_files(files: Iterable[str]) -> list[Suppression]:
    """Suppression comments of every readable file (the I/O; the rest of this module is pure)."""
    found: list[Suppression] = []
    for path in sorted(set(files)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                found.extend(parse(path, f))
        except OSError:
            continue
    return found


def apply(findings: list[Finding], suppressions: list[Suppression]) -> tuple[
        list[Finding], list[tuple[Finding, Suppression]], list[Suppression]]:
    """(kept findings, (suppressed finding, its suppression) pairs, suppressions that matched nothing)."""
    kept, suppressed, used = [], [], set()
    for finding in findings:
        match = next((s for s in suppressions if s.matches(finding)), None)
        if match is None:
            kept.append(finding)
        else:
            suppressed.append((finding, match))
            used.add(match)
    return kept, suppressed, [s for s in suppressions if s not in used]
