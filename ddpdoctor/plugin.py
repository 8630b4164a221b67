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
ranks=(...), location=Location(file, line), evidence=...)], summary="...")``, or ``applicable=False``
when there was nothing to check. An analyzer that raises is reported as a crashed check.

A finding's ``evidence`` is best a typed record, a frozen dataclass deriving from
:class:`EvidenceRecord` whose fields say how people read them, declared once beside the field::

    @dataclass(frozen=True)
    class Drift(EvidenceRecord):
        layer: str = evidence_field(default="", unit="code")
        growth: float = evidence_field(default=0.0, label="growth per step", unit="fraction")
        ranks: list[int] = evidence_field(default_factory=list, hidden=True)

    CHECK = Check(..., evidence=(Drift,))

Every renderer uses those labels and units (``s``, ``bytes``, ``fraction``, ``ranks``, ``code``,
``site``...; see ddpdoctor.analysis.render.evidence.UNITS), the JSON report holds the record's
fields, and a saved report reads it back typed. A plain dict still works: its keys read by the shape
of their values (``kind`` and ``case`` hidden).

A check can be the root cause of other checks' findings, which then appear under it as its
consequences: ``Check(explains=(Explains(name, symptom, cause=..., priority=...),))``, where
``symptom(finding, cause_finding)`` recognises a symptom by the kind of its evidence, never by a check
id: the kinds in ddpdoctor.analysis.symptoms (:class:`RankFailed`, :class:`CollectivesUnmatched`,
:class:`ReplicasDiverged`, ...). A record that inherits a kind can be explained by any check that
explains that kind, built-in or not.

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

from ddpdoctor.analysis import symptoms
from ddpdoctor.analysis.api import (CHECK_API_VERSION, Check, CheckResult, EvidenceRecord, Explains, Finding, Location,
                                    Severity, evidence_field)
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import Event, register_event

__all__ = ["CHECK_API_VERSION", "Check", "CheckResult", "Finding", "Location", "Severity", "Evidence", "Recorder",
           "Event", "register_event", "EvidenceRecord", "evidence_field", "Explains", "symptoms"]
