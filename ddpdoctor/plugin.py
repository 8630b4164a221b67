"""Writing a ddpdoctor check: the plugin API, version 1 (``CHECK_API_VERSION``).

Everything a third-party check needs is importable from here; the names below are the versioned
contract, anything else in ddpdoctor may change between releases.

A check is a :class:`Check` exposed through the ``ddpdoctor.checks`` entry-point group, under a name
equal to its ``id``::

    # pyproject.toml of your package
    [project.entry-points."ddpdoctor.checks"]
    myplugin-thing = "myplugin:CHECK"

``ddpdoctor list-checks`` lists it, ``ddpdoctor explain myplugin-thing`` prints its ``docs``
(markdown with the sections "## What it does", "## Why it matters", "## Example", "## Use instead"),
and every run runs it. A plugin that fails to import, is registered under another name, reuses an
id (built-in ids can never be taken), or declares another ``api_version`` is reported as a broken
check (a warning) and never run; it never aborts a run. ``DDPDOCTOR_DISABLE_PLUGINS=1`` loads the
built-in checks only, and installs no plugin probe.

The analyzer, ``analyze(evidence: Evidence) -> CheckResult``, must be a pure function of the
evidence: every rank's typed events (``evidence.events(Kind)`` yields ``(rank, event)``) and what
the supervisor observed (``evidence.outcome``, ``evidence.world_size``, ...). Return
``CheckResult(findings=[Finding(check=ID, severity="error" | "warning" | "info", message=..., fix=...,
ranks=(...), location=Location(file, line))], summary="...")``, or ``applicable=False`` when there
was nothing to check. An analyzer that raises is reported as a crashed check.

Evidence no built-in probe records comes from the check's own in-rank probe, named by
``Check(probe="myplugin:install")``. Every rank calls ``install(rec: Recorder)`` after the built-in
probes and before the user's script; it may return a finalizer, called when the script ends (also
on a crash). The probe records events with ``rec.emit(MyEvent(...))``, an :class:`Event` subclass
registered with :func:`register_event`; without registration it loads as an ``UnknownEvent``.
Plugin event kinds are namespaced with a dot::

    @register_event
    @dataclass(kw_only=True, slots=True)
    class Thing(Event):
        kind: ClassVar[str] = "myplugin.thing"
        count: int = 0

A probe must never break the user's script: wrap callbacks in ``with rec.guard(ID):``. A probe
whose install or finalizer raises is recorded under the check's id and the report marks that
check incomplete. ``tests/plugin_example`` in the ddpdoctor repository is a complete plugin.
"""

from __future__ import annotations

from ddpdoctor.analysis.api import CHECK_API_VERSION, Check, CheckResult, Finding, Location, Severity
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import Event, register_event

__all__ = ["CHECK_API_VERSION", "Check", "CheckResult", "Finding", "Location", "Severity", "Evidence", "Recorder",
           "Event", "register_event"]
