"""Discovers checks through the ``ddpdoctor.checks`` entry-point group (built-ins included).

A plugin that cannot be used (it fails to import, is no :class:`Check`, is registered under a name
other than its id, claims an id another check has, or was written for another check API version)
becomes a broken :class:`LoadedCheck`: reported, never run, never aborting the run. Built-ins are
loaded first, so a plugin can never replace one.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Optional

from ddpdoctor.analysis.api import CHECK_API_VERSION, Check
from ddpdoctor.plugins import CHECKS_GROUP as GROUP
from ddpdoctor.plugins import DISABLE_PLUGINS_ENV, is_builtin, plugins_disabled
from ddpdoctor.plugins import entry_points as _declared

__all__ = ["GROUP", "DISABLE_PLUGINS_ENV", "LoadedCheck", "load_checks", "checks_for", "find_check", "is_builtin",
           "plugins_disabled"]


def entry_points(group: str) -> list[EntryPoint]:
    """The group's entry points (ddpdoctor.plugins); a name of its own here, for tests to replace."""
    return _declared(group)


@dataclass
class LoadedCheck:
    """A check, or why its entry point failed to load (a broken plugin never aborts a run).

    ``id`` is the entry-point name; a duplicate also names its entry point ("id (module:attr)"),
    so its warning is never counted against the check that owns the id.
    """

    id: str
    check: Optional[Check]
    error: Optional[str] = None


def load_checks(*, builtins: bool = True) -> list[LoadedCheck]:
    """Every check in ``explain`` order. ``builtins=False``: the third-party ones only, without
    importing the built-ins (a rank needs just the plugins' probes); built-in ids stay reserved."""
    points = [ep for ep in entry_points(GROUP) if is_builtin(ep) or not plugins_disabled()]
    owners: dict[str, str] = {}  # id -> the entry-point value that claimed it first
    loaded: dict[str, LoadedCheck] = {}
    for ep in sorted(points, key=lambda ep: not is_builtin(ep)):
        owner = owners.setdefault(ep.name, ep.value)
        if owner != ep.value:
            key = f"{ep.name} ({ep.value})"
            loaded[key] = LoadedCheck(id=key, check=None,
                                      error=f"duplicate check id {ep.name!r}: {owner} already provides it")
        elif ep.name not in loaded and (builtins or not is_builtin(ep)):  # the same check installed twice is one
            loaded[ep.name] = _load(ep)
    return sorted(loaded.values(), key=_order)


def _load(ep: EntryPoint) -> LoadedCheck:
    try:
        check = ep.load()
        if not isinstance(check, Check):
            raise TypeError(f"{ep.value} is a {type(check).__name__}, not a ddpdoctor.Check")
    except Exception as exc:
        return LoadedCheck(id=ep.name, check=None, error=f"{type(exc).__name__}: {exc}")
    if check.id != ep.name:
        return LoadedCheck(id=ep.name, check=None, error=f"entry point {ep.name!r} differs from the check's id "
                                                         f"{check.id!r}; register it as {check.id} = {ep.value}")
    if check.api_version != CHECK_API_VERSION:
        return LoadedCheck(id=ep.name, check=None, error=f"written for check API version {check.api_version}; "
                                                         f"this ddpdoctor supports version {CHECK_API_VERSION}")
    if check.probe is not None and ":" not in check.probe:
        return LoadedCheck(id=ep.name, check=None, error=f"probe {check.probe!r} is not a \"module:function\" path")
    return LoadedCheck(id=ep.name, check=check)


def _order(loaded: LoadedCheck) -> tuple[int, str]:
    """Each check's declared order (built-ins first), then its id; a broken plugin's at the end."""
    return (loaded.check.order if loaded.check is not None else 10**6, loaded.id)


def checks_for(source: str) -> list[LoadedCheck]:
    """The checks that can judge ``source`` (api.RUN, api.ENVIRONMENT, api.POSTMORTEM), as each declares."""
    return [c for c in load_checks() if c.check is not None and source in c.check.sources]


def find_check(check_id: str) -> Optional[LoadedCheck]:
    return next((c for c in load_checks() if c.id == check_id), None)
