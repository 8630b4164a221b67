"""What torchrun leaves behind when a job fails: error files, its failure table, the ranks' logs.

- An error file (``TORCHELASTIC_ERROR_FILE``, written by ``@record`` in the failing rank):
  ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": traceback, "timestamp": s}}}``.
  It does not name its rank; torchrun's layout does (``<log-dir>/<run>/attempt_<k>/<local rank>/error.json``)
  and its failure table maps that file to the global rank.
- The failure table torchrun prints (``ChildFailedError``): one block per failed rank with its time,
  rank, local rank, exit code or signal and error file, and the "Root Cause (first observed
  failure)", which is merely the earliest error file and often a peer's symptom.
- A rank's log: its own output (torchrun ``--log-dir``/``--tee`` files, or one console log with
  ``[rankN]:`` prefixes), read for its last lines and its traceback.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from ddpdoctor.postmortem.dump_events import is_library_file
from ddpdoctor.schema.events import ExceptionEvent
from ddpdoctor.schema.observations import Failure

__all__ = ["ErrorFile", "FailureTable", "RankLog", "read_error_file", "parse_failure_table", "read_log",
           "parse_traceback", "looks_like_error_file", "looks_like_failure_table"]

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(: (?P<message>.*))?$")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(?P<rank>\d+)\]:\s?(?P<text>.*)$")
_BLOCK = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s{2,}(?P<key>[a-z_]+)\s*:\s?(?P<value>.*)$")
_SIGNAL = re.compile(r"\((SIG[A-Z0-9]+)\)")
_LOCAL_RANK_DIR = re.compile(r"attempt_\d+[/\\](\d+)[/\\]")
TAIL_LINES = 40


@dataclass
class ErrorFile:
    path: str
    event: ExceptionEvent
    rank: Optional[int]  # from the file's path; the failure table may say better
    error_code: Optional[int] = None


@dataclass
class FailureTable:
    """torchrun's failure table: its rows, and which rank it called the root cause."""

    failures: list[Failure] = field(default_factory=list)
    root_cause: Optional[int] = None
    error_files: dict[str, int] = field(default_factory=dict)  # error file path -> global rank


@dataclass
class RankLog:
    path: str
    rank: int
    lines: list[str]
    exception: Optional[ExceptionEvent] = None


def looks_like_error_file(data: object) -> bool:
    return isinstance(data, dict) and "message" in data and (
        isinstance(data["message"], dict) and "message" in data["message"] or isinstance(data["message"], str))


def looks_like_failure_table(text: str) -> bool:
    return "Root Cause (first observed failure)" in text or ("Failures:" in text and "exitcode" in text)


def _rank_from_path(path: str) -> Optional[int]:
    match = _LOCAL_RANK_DIR.search(path)
    if match:
        return int(match.group(1))
    digits = re.search(r"(\d+)(\.\w+)?$", os.path.basename(path))
    return int(digits.group(1)) if digits else None


def parse_traceback(text: str) -> tuple[list[dict], Optional[str], str]:
    """(frames outermost first, exception type, message) of the last traceback in ``text``."""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if line.strip().startswith("Traceback (most recent call last)")),
                default=None)
    if start is None:
        return [], None, ""
    frames: list[dict] = []
    exc_type, message_lines = None, []
    i = start + 1
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            frames.append({"file": match["file"], "line": int(match["line"]), "function": match["function"].strip(),
                           "code": code, "user": not is_library_file(match["file"])})
            i += 1
            continue
        stripped = lines[i].strip()
        exc = _EXCEPTION.match(stripped) if not lines[i].startswith(" ") else None
        if exc and frames:
            exc_type = exc["type"].rsplit(".", 1)[-1]
            message_lines = [exc["message"] or ""] + [line for line in lines[i + 1:] if line.strip()]
            break
        i += 1
    return frames, exc_type, "\n".join(message_lines).strip()


def _event(frames: list[dict], exc_type: str, message: str, t: float) -> ExceptionEvent:
    user = [f for f in frames if f["user"]]
    return ExceptionEvent(t=t, type=exc_type, message=message[:4000], frames=frames[-12:],
                          location={"file": user[-1]["file"], "line": user[-1]["line"]} if user else None)


def read_error_file(path: str, data: dict) -> ErrorFile:
    """An error file as the exception event its rank's probe would have written."""
    message = data["message"]
    if isinstance(message, dict):
        text = str(message.get("message") or "")
        extra = message.get("extraInfo") or {}
        callstack = str(extra.get("py_callstack") or "")
        timestamp = extra.get("timestamp")
        code = message.get("errorCode")
    else:
        text, callstack, timestamp, code = str(message), "", data.get("timestamp"), None
    frames, exc_type, tb_message = parse_traceback(callstack)
    head, _, rest = text.partition(": ")
    if exc_type is None:
        exc_type = head if rest and " " not in head else ""
    body = rest if rest and head == exc_type else (tb_message or text)
    try:
        t = float(timestamp) if timestamp is not None else os.path.getmtime(path)
    except (TypeError, ValueError, OSError):
        t = 0.0
    return ErrorFile(path=path, event=_event(frames, exc_type or "", body, t), rank=_rank_from_path(path),
                     error_code=int(code) if isinstance(code, (int, str)) and str(code).lstrip("-").isdigit() else None)


def parse_failure_table(text: str) -> FailureTable:
    """torchrun's failure table(s) in a log; a rank listed twice keeps its first row."""
    table = FailureTable()
    block: Optional[dict] = None
    in_root = False
    rows: list[tuple[dict, bool]] = []
    for line in text.splitlines():
        if "Root Cause (first observed failure)" in line:
            in_root = True
            continue
        if line.startswith("Failures:"):
            in_root = False
            continue
        if _BLOCK.match(line):
            block = {}
            rows.append((block, in_root))
            continue
        match = _FIELD.match(line)
        if match and block is not None:
            block[match["key"]] = match["value"].strip()
        elif line.startswith("=") or line.startswith("-"):
            block = None
    seen: set[int] = set()
    for values, root in rows:
        rank_text = values.get("rank", "")
        rank_match = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", rank_text)
        if not rank_match:
            continue
        rank = int(rank_match.group(1))
        local = int(rank_match.group(2)) if rank_match.group(2) else None
        code_match = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", values.get("exitcode", ""))
        exitcode = int(code_match.group(1)) if code_match else 0
        pid = int(code_match.group(2)) if code_match and code_match.group(2) else None
        signal = _SIGNAL.search(values.get("exitcode", ""))
        if root:
            table.root_cause = rank
        error_file = values.get("error_file", "")
        if error_file and error_file != "<N/A>":
            table.error_files[os.path.normpath(error_file)] = rank
        if rank in seen:
            continue
        seen.add(rank)
        table.failures.append(Failure(rank=rank, exitcode=exitcode, signal=signal.group(1) if signal else None,
                                      local_rank=local, pid=pid, t=_table_time(values.get("time", ""))))
    table.failures.sort(key=lambda f: f.rank)
    return table


def _table_time(text: str) -> float:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d_%H:%M:%S").timestamp()
    except ValueError:
        return 0.0


def read_log(path: str, text: str, *, rank: Optional[int] = None) -> dict[int, RankLog]:
    """A rank's log, or a console log whose lines carry ``[rankN]:`` prefixes: rank -> its lines and
    its last traceback (timed by the file's modification time: logs carry no reliable clock)."""
    per_rank: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = _RANK_PREFIX.match(line)
        if match:
            per_rank.setdefault(int(match["rank"]), []).append(match["text"])
    if not per_rank:
        rank = _rank_from_path(path) if rank is None else rank
        if rank is None:
            return {}
        per_rank[rank] = text.splitlines()
    mtime = os.path.getmtime(path)
    out = {}
    for r, lines in per_rank.items():
        frames, exc_type, message = parse_traceback("\n".join(lines))
        event = _event(frames, exc_type, message, mtime) if exc_type else None
        out[r] = RankLog(path=path, rank=r, lines=lines[-TAIL_LINES:], exception=event)
    return out


def load_json(path: str) -> Optional[object]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
