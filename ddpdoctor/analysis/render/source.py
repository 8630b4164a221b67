"""The user's own source lines under a finding, as ruff and rustc show them.

The report keeps the lines its locations point at (``sources`` in the JSON report: file -> line
number -> text, with one line of context before), so ``ddpdoctor report`` shows the code on a machine
without the files; where a report lacks them, the renderer reads the files, and shows just
``file:line`` when neither has them.
"""

from __future__ import annotations

import io
import linecache
import os
import tokenize
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

__all__ = ["CONTEXT_LINES", "MAX_LOCATIONS", "Snippet", "Sources", "collect_sources", "snippet", "display_path",
           "underline"]

CONTEXT_LINES = 1  # lines shown above the flagged one
MAX_LOCATIONS = 2000  # distinct (file, line) pairs kept in a report: bounded for 1024 ranks
MAX_LINE_CHARS = 300

Sources = Mapping[str, Mapping[str, str]]  # file -> {line number: text}: the report's ``sources``


@dataclass(frozen=True)
class Snippet:
    file: str
    line: int
    function: Optional[str]
    lines: tuple[tuple[int, str], ...]  # (number, text) in order, the flagged line last

    @property
    def text(self) -> str:
        return self.lines[-1][1] if self.lines else ""


def display_path(path: str, cwd: Optional[str] = None) -> str:
    """Relative to the working directory when the file is under it, else as recorded."""
    try:
        relative = os.path.relpath(path, cwd or os.getcwd())
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def _read_line(file: str, number: int) -> Optional[str]:
    if not file or file.startswith("<") or number < 1:
        return None
    text = linecache.getline(file, number)
    return text.rstrip("\n")[:MAX_LINE_CHARS] if text else None


def snippet(file: str, line: int, *, sources: Optional[Sources] = None, function: Optional[str] = None,
            context: int = CONTEXT_LINES) -> Optional[Snippet]:
    """The flagged line and up to ``context`` non-blank lines above it, from the report's saved
    ``sources`` first (what ran), else from the file on this machine; None when neither has it."""
    saved = (sources or {}).get(file) or {}

    def get(number: int) -> Optional[str]:
        text = saved.get(str(number))
        return text if text is not None else _read_line(file, number)

    flagged = get(line)
    if flagged is None or not flagged.strip():
        return None
    lines = [(line, flagged)]
    for number in range(line - 1, max(0, line - 1 - context), -1):
        text = get(number)
        if text is None or not text.strip():
            break
        lines.insert(0, (number, text))
    return Snippet(file=file, line=line, function=function, lines=tuple(lines))


def underline(text: str) -> tuple[int, int]:
    """(start, end) columns of the code on a line: from its first non-blank character to the end of
    the statement, without a trailing comment."""
    start = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    try:
        for token in tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline):
            if token.type == tokenize.COMMENT:
                end = start + len(text.strip()[: token.start[1]].rstrip())
                break
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # an unfinished line of a multi-line statement: underline it all
    return start, max(end, start + 1)


def _locations(value: Any, depth: int = 0) -> Iterator[tuple[str, int]]:
    """Every {file, line} inside a finding's JSON (its location, evidence sites, per-rank places)."""
    if depth > 6:
        return
    if isinstance(value, dict):
        file, line = value.get("file"), value.get("line")
        if isinstance(file, str) and isinstance(line, int):
            yield file, line
        for item in value.values():
            if isinstance(item, (dict, list)):
                yield from _locations(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                yield from _locations(item, depth + 1)


def collect_sources(findings: Sequence[Mapping[str, Any]], *,
                    context: int = CONTEXT_LINES) -> dict[str, dict[str, str]]:
    """file -> {line number: text} for every location the findings name (with their context),
    read on the machine that builds the report; files that cannot be read are left out."""
    out: dict[str, dict[str, str]] = {}
    seen: set[tuple[str, int]] = set()
    for file, line in _locations(findings):
        if (file, line) in seen:
            continue
        seen.add((file, line))
        if len(seen) > MAX_LOCATIONS:
            break
        found = snippet(file, line, context=context)
        if found is None:
            continue
        target = out.setdefault(file, {})
        for number, text in found.lines:
            target[str(number)] = text
    return out
