"""Per-project defaults from `[tool.ddpdoctor]` in the nearest pyproject.toml (the CLI wins).

    [tool.ddpdoctor]
    nproc-per-node = 2
    hang-timeout = 60
    max-steps = 50
    fail-on = "error"
    ignore = ["set-epoch"]
    junit = "reports/ddpdoctor.xml"

Keys are the long option names of `ddpdoctor check`; an unknown key or a value of the wrong type
is a usage error.
"""

from __future__ import annotations

import os
from typing import Any, Optional

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

# key -> the Python types it accepts
KEYS: dict[str, tuple[type, ...]] = {
    "nproc-per-node": (int,), "nnodes": (int,), "hang-timeout": (int, float), "timeout": (int, float),
    "fail-on": (str,), "exit-zero": (bool,), "launch": (str,), "fingerprint-every": (int,),
    "max-steps": (int,), "max-epochs": (int,), "select": (list,), "ignore": (list,), "json": (str,),
    "junit": (str,), "sarif": (str,), "markdown": (str,), "github": (bool,), "quiet": (bool,),
    "plain": (bool,), "device": (str,), "min-busbw": (int, float), "html": (str,), "trace": (str,),
}
PATH_KEYS = ("json", "junit", "sarif", "markdown", "html", "trace")


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
        if key not in KEYS:
            raise ValueError(f"{path}: unknown key {raw_key!r} in [tool.ddpdoctor]; known: {', '.join(sorted(KEYS))}")
        types = KEYS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{path}: [tool.ddpdoctor] {raw_key} must be a {expected}, not {value!r}")
        if key in ("select", "ignore") and not all(isinstance(v, str) for v in value):
            raise ValueError(f"{path}: [tool.ddpdoctor] {raw_key} must be a list of check ids")
        if key in PATH_KEYS:
            value = os.path.join(os.path.dirname(path), value)
        settings[key] = value
    return path, settings
