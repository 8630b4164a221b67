"""What a check concludes, shared by the analysis side (which makes findings) and the supervisor side
(which gates an exit code on their severity): :class:`Severity`, :class:`Location`, :class:`Finding`,
:class:`Consequence`, and the base of every check's typed evidence, :class:`EvidenceRecord`.

Evidence is typed so that the names a report is built from exist once: a check declares its evidence
as a dataclass whose fields carry their human label and unit (:func:`evidence_field`); renderers read
those, the causality pass reads attributes, and the JSON report is the record's :meth:`~EvidenceRecord.to_json`,
unchanged from the dicts checks wrote before. A plugin may still pass a plain dict: it becomes
:class:`RawEvidence`, rendered by the shape of its values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Iterator, Mapping, Optional, Union

__all__ = ["Severity", "DEFAULT_FAIL_ON", "Location", "FieldInfo", "evidence_field", "EvidenceRecord", "RawEvidence",
           "as_evidence", "Consequence", "Finding", "register_evidence", "evidence_type"]


class Severity(str, Enum):
    """How bad a finding is. A ``str`` enum: ``Severity.ERROR == "error"``, and JSON writes "error"."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its value, so "error" finds Severity.ERROR in a set or dict
        return hash(self.value)

    @property
    def rank(self) -> int:
        """0 (info) < 1 (warning) < 2 (error): for sorting and ``--fail-on`` thresholds."""
        return _SEVERITY_RANK[self.value]

    @classmethod
    def parse(cls, value: Union[str, "Severity"]) -> "Severity":
        """The severity ``value`` names; ValueError naming the three for anything else."""
        try:
            return cls(str(value))
        except ValueError:
            raise ValueError(f"unknown severity {value!r}; expected one of: "
                             f"{', '.join(s.value for s in cls)}") from None


_SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


class Status(str, Enum):
    """A check's verdict in the report: "fail" (an error), "warn", "pass", or "skip" (nothing to check,
    or the check could not run). A ``str`` enum: JSON writes the word."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:
        return hash(self.value)

    @classmethod
    def of(cls, severities: "set[Severity] | set[str]", *, applicable: bool = True) -> "Status":
        """The status findings of these severities give a check."""
        if not applicable:
            return cls.SKIP
        if Severity.ERROR in severities:
            return cls.FAIL
        if Severity.WARNING in severities:
            return cls.WARN
        return cls.PASS

# The lowest severity that fails a run unless `--fail-on` says otherwise. Declared here, on the analysis
# side, so the verdicts and renderers default to it too; the option (supervisor/options.py) takes it.
DEFAULT_FAIL_ON = Severity.WARNING


@dataclass(frozen=True)
class Location:
    file: str
    line: int

    @classmethod
    def from_site(cls, site: Any) -> Optional["Location"]:
        """From a probe's call site: a {file, line} dict or a list of them (innermost first)."""
        if isinstance(site, list):
            site = site[0] if site else None
        if isinstance(site, dict) and site.get("file") and site.get("line") is not None:
            return cls(file=site["file"], line=int(site["line"]))
        return None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}


class _Absent:
    """The value of an evidence field the finding has not got at all (never in the JSON), as opposed to
    one it has with no value (None, written as null where the field keeps its None)."""

    _instance: ClassVar[Optional["_Absent"]] = None

    def __new__(cls) -> "_Absent":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class FieldInfo:
    """How people read one evidence field. ``label``: its name in words (None: the field name in words).
    ``unit``: how its value reads (see ddpdoctor.analysis.render.evidence.UNITS: "s", "bytes", "gbps",
    "pct", "fraction", "ranks", "rank", "code", "names", "site", "shape"...; None: by the value's
    shape). ``hidden``: the message already says it, or only tools read it (it stays in the JSON).
    ``key``: its JSON key where that is no Python name (``pass``). ``keep_none``: written as null
    when None (otherwise a None field is left out of the JSON, as an absent key was before).
    ``labels``, ``units``: the labels and units of the keys of records nested in the value."""

    label: Optional[str] = None
    unit: Optional[str] = None
    hidden: bool = False
    key: Optional[str] = None
    keep_none: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)


_INFO = "ddpdoctor"


def evidence_field(default: Any = None, *, label: Optional[str] = None, unit: Optional[str] = None,
                   hidden: bool = False, key: Optional[str] = None, keep_none: bool = False,
                   labels: Optional[Mapping[str, str]] = None, units: Optional[Mapping[str, str]] = None,
                   default_factory: Any = None) -> Any:
    """A field of an :class:`EvidenceRecord` with its label and unit beside it."""
    info = FieldInfo(label=label, unit=unit, hidden=hidden, key=key, keep_none=keep_none, labels=dict(labels or {}),
                     units=dict(units or {}))
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={_INFO: info})
    return field(default=default, metadata={_INFO: info})


def _jsonable(value: Any) -> Any:
    if isinstance(value, EvidenceRecord):
        return value.to_json()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class EvidenceRecord:
    """Base of a check's evidence: a frozen dataclass whose fields are declared with :func:`evidence_field`.

    Fields are written to JSON in declaration order, a None field left out unless it keeps its None."""

    def to_json(self) -> dict[str, Any]:
        return {key: _jsonable(value) for key, value, _ in self.rows()}

    def rows(self) -> Iterator[tuple[str, Any, FieldInfo]]:
        """(JSON key, value, how to read it) per field present, in declaration order."""
        read: Optional[frozenset[str]] = self.__dict__.get("_read_keys")
        for f, info in self._fields():
            value = getattr(self, f.name)
            key = info.key or f.name
            if value is ABSENT or (value is None and not info.keep_none) or (read is not None and key not in read):
                continue
            yield key, value, info

    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field[Any], FieldInfo]]:
        cached = cls.__dict__.get("_field_infos")
        if cached is None:
            cached = [(f, f.metadata.get(_INFO) or FieldInfo()) for f in dataclasses.fields(cls)]
            setattr(cls, "_field_infos", cached)
        return cached

    # Values of fields that tell this record type from its check's others (``{"kind": "hang"}``): a
    # saved report's evidence is read back as the first of the check's types it matches.
    discriminator: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def matches(cls, data: Mapping[str, Any]) -> bool:
        keys = {info.key or f.name for f, info in cls._fields()}
        return set(data) <= keys and all(data.get(k) == v for k, v in cls.discriminator.items())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "EvidenceRecord":
        """Back from :meth:`to_json` (a saved report rendered again), writing the same JSON back; keys this
        build does not know are kept as :class:`RawEvidence` rather than lost."""
        keys = {info.key or f.name: f.name for f, info in cls._fields()}
        if not set(data) <= set(keys):
            return RawEvidence(dict(data))
        record = cls(**{keys[k]: v for k, v in data.items()})
        # a key the JSON has not got is written back as absent, not as its field's default: the same JSON
        object.__setattr__(record, "_read_keys", frozenset(data))
        return record

    def __bool__(self) -> bool:
        return bool(self.to_json())

    # A read-only view by JSON key, for tools and tests reading a report; the analysis reads attributes.
    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_json()


_CONVENTIONAL = {"kind": FieldInfo(hidden=True), "case": FieldInfo(hidden=True)}


@dataclass(frozen=True, eq=False)
class RawEvidence(EvidenceRecord):
    """Evidence given as a plain dict (a plugin's, or a saved report's of an unknown check): rendered
    by the shape of its values, written to JSON as it is."""

    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in self.data.items()}

    def rows(self) -> Iterator[tuple[str, Any, FieldInfo]]:
        """Every key, read by its value's shape; ``kind`` and ``case``, by convention the code that tells
        tools which case a finding is (its message says it in words), are hidden."""
        for key, value in self.data.items():
            yield key, value, _CONVENTIONAL[key] if key in _CONVENTIONAL else FieldInfo()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RawEvidence):
            return dict(self.data) == dict(other.data)
        if isinstance(other, dict):
            return dict(self.data) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def as_evidence(value: Union[EvidenceRecord, Mapping[str, Any], None], check: Optional[str] = None) -> EvidenceRecord:
    """``value`` as a record: a dict given for a check that declares its evidence types is read as the
    first of them it matches (as a saved report's is), any other dict as :class:`RawEvidence`."""
    if isinstance(value, EvidenceRecord):
        return value
    if check is not None:
        return _evidence_from_json(check, value)
    return RawEvidence(dict(value or {}))


# check id -> its evidence record types, so a saved report's evidence comes back typed.
_EVIDENCE_TYPES: dict[str, tuple[type[EvidenceRecord], ...]] = {}


def register_evidence(check_id: str, records: tuple[type[EvidenceRecord], ...]) -> None:
    _EVIDENCE_TYPES[check_id] = records


def evidence_type(check_id: str, data: Mapping[str, Any]) -> Optional[type[EvidenceRecord]]:
    """The first of the check's record types ``data`` (a finding's JSON evidence) matches, or None."""
    return next((r for r in _EVIDENCE_TYPES.get(check_id, ()) if r.matches(data)), None)


def _evidence_from_json(check_id: str, data: Optional[Mapping[str, Any]]) -> EvidenceRecord:
    record = evidence_type(check_id, data or {})
    if record is None:
        return RawEvidence(dict(data or {}))
    return record.from_json(data or {})


@dataclass(frozen=True)
class Consequence:
    """A symptom explained by a root-cause finding: shown under it, never counted on its own."""

    check: str
    message: str
    ranks: tuple[int, ...] = ()
    location: Optional[Location] = None
    evidence: EvidenceRecord = field(default_factory=RawEvidence)
    severity: Severity = Severity.ERROR  # what the check would have said on its own

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", as_evidence(self.evidence, self.check))
        object.__setattr__(self, "severity", Severity.parse(self.severity))

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "message": self.message, "ranks": sorted(self.ranks),
                "location": self.location.to_json() if self.location else None, "evidence": self.evidence.to_json(),
                "severity": self.severity.value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Consequence":
        """Back from :meth:`to_json`, so a saved report can be rendered again (unknown keys ignored)."""
        return cls(check=data["check"], message=data["message"], ranks=tuple(data.get("ranks", ())),
                   location=Location.from_site(data.get("location")),
                   evidence=_evidence_from_json(data["check"], data.get("evidence")),
                   severity=Severity.parse(data.get("severity", "error")))


@dataclass(frozen=True)
class Finding:
    """One problem a check found. ``evidence``: the check's typed record (a dict is read as one of the
    check's declared types where it matches one, else kept as :class:`RawEvidence`)."""

    check: str
    severity: Severity
    message: str
    fix: str
    ranks: tuple[int, ...] = ()
    location: Optional[Location] = None
    evidence: EvidenceRecord = field(default_factory=RawEvidence)
    consequences: tuple[Consequence, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", as_evidence(self.evidence, self.check))
        object.__setattr__(self, "severity", Severity.parse(self.severity))

    def as_consequence(self) -> Consequence:
        return Consequence(check=self.check, message=self.message, ranks=self.ranks, location=self.location,
                           evidence=self.evidence, severity=self.severity)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.value,
            "message": self.message,
            "ranks": sorted(self.ranks),
            "location": self.location.to_json() if self.location else None,
            "evidence": self.evidence.to_json(),
            "fix": self.fix,
            "consequences": [c.to_json() for c in self.consequences],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Finding":
        """Back from :meth:`to_json`, so a saved report can be rendered again (unknown keys ignored)."""
        return cls(check=data["check"], severity=Severity.parse(data["severity"]), message=data["message"],
                   fix=data["fix"], ranks=tuple(data.get("ranks", ())),
                   location=Location.from_site(data.get("location")),
                   evidence=_evidence_from_json(data["check"], data.get("evidence")),
                   consequences=tuple(Consequence.from_json(c) for c in data.get("consequences", ())))
