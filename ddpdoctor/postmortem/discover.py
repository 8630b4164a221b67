"""Which of the files given are what: flight recorder dumps, torchrun error files, logs, and the
rest (ignored, with the reason). Sorted by their content, not their names: folders are walked, globs
expanded; ddpdoctor's own evidence files in a ``--keep-evidence`` folder are skipped silently."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from ddpdoctor.postmortem import torchrun_files

__all__ = ["Inputs", "discover", "read_text_tail"]

_LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
_TEXT_TAIL = 4 << 20  # a log's last 4 MiB hold its traceback and torchrun's failure table


@dataclass
class Inputs:
    """The files given, sorted by what they are."""

    dumps: list[str] = field(default_factory=list)
    error_files: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def discover(paths: list[str]) -> Inputs:
    """Sort the paths given (folders walked, globs expanded) into dumps, error files and logs.
    A path that does not exist is a ValueError."""
    inputs = Inputs()
    seen: set[str] = set()
    for given in paths:
        if os.path.isdir(given):
            for root, dirs, files in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(f for f in files if not f.startswith(".")):  # hidden: not a job's output
                    _sort(os.path.join(root, name), inputs, seen, explicit=False)
            continue
        matches = sorted(glob.glob(given)) if glob.has_magic(given) else [given]
        if not matches or not all(os.path.exists(m) for m in matches):
            raise ValueError(f"no such file or folder: {given}")
        for path in matches:
            if os.path.isdir(path):
                inputs_from_dir = discover([path])
                for kind in ("dumps", "error_files", "logs", "ignored"):
                    known = getattr(inputs, kind)
                    known.extend(x for x in getattr(inputs_from_dir, kind) if x not in known)
            else:
                _sort(path, inputs, seen, explicit=True)
    return inputs


def _sort(path: str, inputs: Inputs, seen: set[str], *, explicit: bool) -> None:
    real = os.path.realpath(path)
    if real in seen:
        return
    seen.add(real)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        inputs.ignored.append((path, f"unreadable ({exc.strerror})"))
        return
    if head[:1] == b"\x80":
        inputs.dumps.append(path)
    elif head.lstrip()[:1] == b"{":
        data = torchrun_files.load_json(path)
        if isinstance(data, dict) and isinstance(data.get("entries"), list):
            inputs.dumps.append(path)
        elif torchrun_files.looks_like_error_file(data):
            inputs.error_files.append(path)
        elif not _ours(path):
            inputs.ignored.append((path, "JSON that is neither a flight recorder dump nor a torchrun error file"))
    elif b"\0" in head:
        if not _ours(path):
            inputs.ignored.append((path, "a binary file that is not a flight recorder dump"))
    elif explicit or path.endswith(_LOG_SUFFIXES):
        inputs.logs.append(path)
    elif not _ours(path):
        inputs.ignored.append(
            (path, "text without a .log/.out/.err/.txt name (name it on the command line to read it)"))


def _ours(path: str) -> bool:
    """ddpdoctor's own evidence files in a --keep-evidence folder: not for this reader."""
    name = os.path.basename(path)
    return name.startswith(("events-", "hb-", "stack-", "agent-", "dump-request"))


def read_text_tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - _TEXT_TAIL))
        return f.read().decode("utf-8", errors="replace")
