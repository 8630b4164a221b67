"""Per-project defaults from `[tool.ddpdoctor]` in the nearest pyproject.toml (the CLI wins).

    [tool.ddpdoctor]
    nproc-per-node = 2
    hang-timeout = 60
    max-steps = 50
    fail-on = "error"
    ignore = ["set-epoch"]
    junit = "reports/ddpdoctor.xml"

Keys are the long option names of `ddpdoctor check` (every option declared with a config key in
:mod:`ddpdoctor.supervisor.options`, ``keep-evidence`` included); an unknown key or a value of the
wrong type is a usage error. Paths are relative to the file.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any, Optional

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from ddpdoctor.supervisor.options import CONFIG, Option


def accepted_types(option: Option) -> tuple[type, ...]:
    """The TOML value types ``option`` takes: a float option takes an integer too; a path or a choice, a string."""
    if option.type is float:
        return (int, float)
    if option.type is Path or isinstance(option.type, type) and issubclass(option.type, enum.Enum):
        return (str,)
    return (option.type,)


def find_pyproject(start: str) -> Optional[str]:
    """The nearest pyproject.toml from ``start`` upwards."""
    directory = os.path.abspath(start)
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def load(start: str) -> tuple[Optional[str], dict[str, Any]]:
    """(the file, its `[tool.ddpdoctor]` settings validated); paths resolved against the file."""
    path = find_pyproject(start)
    if path is None:
        return None, {}
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("tool", {}).get("ddpdoctor", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    settings: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("_", "-")
        option = CONFIG.get(key)
        if option is None:
            raise ValueError(f"{path}: unknown key {raw_key!r} in [tool.ddpdoctor]; known: {', '.join(sorted(CONFIG))}")
        types = accepted_types(option)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{path}: [tool.ddpdoctor] {raw_key} must be a {expected}, not {value!r}")
        if option.type is Path:
            value = os.path.join(os.path.dirname(path), value)
        try:
            option.check(value, label=raw_key)  # the value stays as written (an alias too); the command resolves it
        except ValueError as exc:
            raise ValueError(f"{path}: [tool.ddpdoctor] {exc}") from None
        settings[key] = value
    return path, settings
