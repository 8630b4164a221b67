"""A finding's evidence in words: human labels, rounded numbers with units, no JSON, no internal keys.

Checks put what they measured in ``Finding.evidence``, a typed record whose fields declare their label,
unit and whether people see them (``evidence_field``; the JSON report keeps every field). People read
it through :func:`evidence_rows`: one (label, lines) row per shown field, formatted by its declared
unit (:data:`UNITS`) or else by the value's shape, so a plugin's plain dict renders well too:

- a map keyed by rank (``{"0": 3, "1": 4}``) groups equal values: ``ranks 0, 2: 3 · rank 1: 4``;
- a map of rank maps (per parameter, per loader) gives one line per entry;
- a call site (``{"file", "line", "function"}``, or a list of them) reads ``train.py:31 (main)``;
- a record (a map of named fields) reads as one phrase: its rank, its subject (the first text field),
  then its prepositional fields (``at``, ``after_step``...) and its other facts:
  ``{"call": ".cpu()", "at": site, "after_step": 1}`` is "`.cpu()` at train.py:31 after step 1";
- a list of records gives one line per record, a list of pairs ``(1, 0), (2, 1)``, a shape ``4×3``;
- floats keep three significant digits, with the unit the key's suffix names (``_s``, ``_bytes``,
  ``_gbps``, ``_pct``); long lists are cut between items, never inside a word.

A field's declaration may also name the labels and units of the keys of records nested in it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from ddpdoctor.analysis.symptoms import HangKind
from ddpdoctor.schema.events import InternalPhase
from ddpdoctor.schema.findings import EvidenceRecord, FieldInfo, as_evidence

__all__ = ["UNITS", "PHASES", "VIEW_UNITS", "RANK_STATES", "RANK_CALLS", "COLLECTIVE_TIMELINE", "DIVERGENCE",
           "EvidenceViews", "evidence_views", "evidence_rows", "format_value", "record_text", "site_text", "ranks_text",
           "number", "size", "seconds", "call_text"]

MAX_ITEMS = 8
MAX_GROUPS = 6
MAX_LINES = 6

Formatter = Callable[[Any], str]


def number(value: float) -> str:
    """Three significant digits, no exponent for everyday magnitudes: 0.298, 12.3, 4,096."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude < 1e-3:
        return f"{value:.2e}"
    digits = max(0, 2 - int(math.floor(math.log10(magnitude))))
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def size(value: float) -> str:
    """Bytes in binary units: 512 B, 4.0 KiB, 1.5 GiB."""
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{number(value)} {unit}"
        value /= 1024
    return f"{value} B"


def seconds(value: float) -> str:
    if value < 1e-3:
        return f"{number(value * 1e6)} µs"
    if value < 1:
        return f"{number(value * 1e3)} ms"
    return f"{number(value)} s"


def percent(value: float) -> str:
    return f"{number(value * 100)} %"


def site_text(site: Any) -> str:
    """``train.py:31 (main)`` for a call site, or the innermost of a list of frames."""
    if isinstance(site, list):
        site = next((s for s in site if isinstance(s, dict)), None)
    if not isinstance(site, dict) or not site.get("file"):
        return ""
    name = os.path.basename(str(site["file"]))
    function = f" ({site['function']})" if site.get("function") else ""
    return f"{name}:{site.get('line')}{function}"


def ranks_text(ranks: Iterable[Any]) -> str:
    """``rank 3``, ``ranks 0, 1, 5``, ``ranks 0-7`` (consecutive runs collapse)."""
    values = sorted({int(r) for r in ranks})
    if not values:
        return "no rank"
    runs: list[str] = []
    start = prev = values[0]
    following: list[Optional[int]] = [*values[1:], None]
    for r in following:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else (f"{start}, {prev}" if prev == start + 1 else f"{start}-{prev}"))
        if r is not None:
            start = prev = r
    return ("rank " if len(values) == 1 else "ranks ") + ", ".join(runs)


# What DDP's own collectives are part of (the collective trace's ``phase``), in words.
PHASES = {phase.value: phase.part_of for phase in InternalPhase if phase.is_ddp}


def call_text(call: Mapping[str, Any]) -> str:
    """One rank's collective call: ``all_reduce of float32[4]``, or the DDP phase an internal one belongs to."""
    tensors = ", ".join(f"{t[1]}[{', '.join(map(str, t[0]))}]" for t in call.get("tensors") or []
                        if isinstance(t, list) and len(t) == 2)
    what = call.get("op") or PHASES.get(call.get("phase") or "",
                                        str(call.get("phase") or "a collective").replace("-", " "))
    if call.get("op") and call.get("phase") in PHASES:
        what += f" in {PHASES[call['phase']]}"
    return what + (f" of {tensors}" if tensors else "")


def _is_site(value: Any) -> bool:
    return isinstance(value, dict) and "file" in value and "line" in value


def _is_sites(value: Any) -> bool:
    return _is_site(value) or (isinstance(value, list) and bool(value) and all(_is_site(v) for v in value))


def _is_rank_map(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(str(k).lstrip("-").isdigit() for k in value)


def _is_record(value: Any) -> bool:
    """A map of named fields (not a rank map, not a call site): said as a phrase, never as ``k: v, k: v``."""
    return isinstance(value, dict) and bool(value) and not _is_rank_map(value) and not _is_site(value)


def _absent(value: Any) -> bool:
    """Nothing to say: no value, an empty container, or a list of unknowns."""
    if value is None or value == [] or value == {} or value == "":
        return True
    return isinstance(value, list) and all(v is None for v in value)


def _is_shape_key(key: str) -> bool:
    return key.endswith(("shape", "shapes"))


def _items(values: list[Any], fmt: Formatter) -> str:
    shown = [fmt(v) for v in values[:MAX_ITEMS]]
    more = len(values) - len(shown)
    if len(values) > 3 and len({repr(v) for v in values}) == 1:
        return f"{fmt(values[0])} (all {len(values)})"
    return ", ".join(shown) + (f", … ({more} more)" if more > 0 else "")


def _rank_map(value: Mapping[str, Any], fmt: Formatter) -> str:
    groups = _rank_groups(value, fmt)
    if len(groups) == 1 and len(value) > 1:
        text, ranks = groups[0]
        return f"{text} on {ranks_text(ranks)}"
    parts = [f"{ranks_text(r)}: {text}" for text, r in groups[:MAX_GROUPS]]
    if len(groups) > MAX_GROUPS:
        parts.append(f"… ({len(groups) - MAX_GROUPS} more groups)")
    return " · ".join(parts)


def _rank_groups(value: Mapping[str, Any], fmt: Formatter) -> list[tuple[str, list[int]]]:
    """(text, ranks) per distinct formatted value, lowest rank first."""
    groups: dict[str, list[int]] = {}
    for rank, v in value.items():
        groups.setdefault(fmt(v), []).append(int(rank))
    return sorted(groups.items(), key=lambda kv: min(kv[1]))


def _list_item(value: Any, key: str, depth: int) -> str:
    """One item of a list: a nested list of several values in parentheses, so pairs stay pairs."""
    text = format_value(value, key, depth=depth + 1)
    return f"({text})" if isinstance(value, (list, tuple)) and ", " in text else text


def format_value(value: Any, key: str = "", *, depth: int = 0) -> str:
    """One value in words, by its shape and the unit its key names."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if key.endswith("_bytes") or key == "bytes":
            return size(value)
        if key.endswith("_s"):
            return seconds(float(value))
        if key.endswith("_gbps"):
            return f"{number(value)} GB/s"
        if key.endswith("_pct"):
            return f"{number(value)} %"
        return number(value)
    if isinstance(value, str):
        return value
    if _is_site(value):
        return site_text(value)
    if isinstance(value, (list, tuple)):
        return _list_text(list(value), key, depth)
    if isinstance(value, dict):
        if not value:
            return "none"
        if _is_rank_map(value):
            return _rank_map(value, lambda v: format_value(v, key, depth=depth + 1))
        if depth >= 3:
            return f"{len(value)} entries"
        return record_text(value, depth=depth)
    return str(value)


def _list_text(value: list[Any], key: str, depth: int) -> str:
    if _is_shape_key(key) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "×".join(map(str, value)) if value else "scalar"
    if not value:
        return "none"
    if all(_is_site(v) for v in value):
        return site_text(value)
    if any(_is_record(v) for v in value):  # records: a phrase each, "; " between them
        lines = _record_lines(value, depth=depth)
        return "; ".join(lines)
    return _items(value, lambda v: _list_item(v, key, depth))


def _record_lines(records: list[Any], *, depth: int = 0) -> list[str]:
    """One phrase per record (at most MAX_LINES, then how many more)."""
    lines = [format_value(r, depth=depth + 1) for r in records[:MAX_LINES]]
    if len(records) > MAX_LINES:
        lines.append(f"… ({len(records) - MAX_LINES} more)")
    return lines


_PREPOSITIONS = frozenset({"at", "after", "before", "in", "on", "via", "by", "from", "to", "since", "until", "for",
                           "of", "with", "during", "into", "through"})
# Keys whose value is data only tools read, hidden at every depth (a field's declaration hides more).
RAW_KEYS = frozenset({"fingerprints", "fingerprint", "frames", "stacks", "stack", "decoded", "timeline", "calls"})
_WHO = ("rank", "ranks")
_WHERE_KEYS = ("site", "where", "location", "call_site")  # a call site under these names reads "at file:line"


def _field_text(key: str, value: Any, depth: int) -> str:
    unit = _NESTED_UNITS.get().get(key)
    fmt = UNITS.get(unit) if unit else None
    return fmt(value) if fmt is not None else format_value(value, key, depth=depth + 1)


# The labels and units of the keys of records nested in the field being rendered (FieldInfo.labels, .units).
_NESTED: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("nested_labels", default={})
_NESTED_UNITS: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("nested_units", default={})


@contextlib.contextmanager
def _nested(info: FieldInfo) -> Iterator[None]:
    """Within: the keys of records nested in this field read with the labels and units it declares."""
    labels, units = _NESTED.set(info.labels), _NESTED_UNITS.set(info.units)
    try:
        yield
    finally:
        _NESTED.reset(labels)
        _NESTED_UNITS.reset(units)


def record_text(record: Mapping[Any, Any], *, depth: int = 0) -> str:
    """A record as one phrase: ``rank 0: `.cpu()` at train.py:31 after step 1, count 4``.

    The rank (a ``rank``/``ranks`` field) leads, then the subject (the first field, when it is text),
    then the fields whose label starts with a preposition (``at``, ``after step``, ``via``), then the
    other facts as ``label value``. A call site already shown (the innermost frame of another site
    field) is not repeated."""
    who, subject = "", ""
    phrases: list[str] = []
    facts: list[str] = []
    richest = _richest_sites(record)
    seen_sites: set[tuple[Any, Any]] = set()
    for raw_key, value in record.items():
        key = str(raw_key)
        if key in RAW_KEYS or _absent(value):
            continue
        if _is_sites(value):
            where = _where(value)
            if where in seen_sites:
                continue
            seen_sites.add(where)
            value = richest.get(where, value)
        if key in _WHO and not who and _is_ranks(value):
            who = ranks_text(value if isinstance(value, list) else [value])
            continue
        text = _field_text(key, value, depth)
        label = "at" if _is_sites(value) and key in _WHERE_KEYS else _label_of(key)
        prepositional = label.split(" ")[0] in _PREPOSITIONS and ": " not in text
        if not subject and not phrases and not facts and isinstance(value, str) and not prepositional:
            subject = text
        elif prepositional:
            phrases.append(f"{label} {text}")
        elif _is_record(value):
            facts.append(f"{label} ({text})")
        else:
            facts.append(f"{label}: {text}" if ": " in text else f"{label} {text}")
    head = " ".join(part for part in (subject, *phrases) if part)
    separator = "; " if any(", " in fact for fact in facts) else ", "
    body = separator.join(part for part in (head, *facts) if part)
    if who:
        return f"{who}: {body}" if body else who
    return body or "none"


def _where(site: Any) -> tuple[Any, Any]:
    """(file, line) of a call site's innermost frame."""
    innermost = site[0] if isinstance(site, list) else site
    return innermost.get("file"), innermost.get("line")


def _richest_sites(record: Mapping[Any, Any]) -> dict[tuple[Any, Any], Any]:
    """Per (file, line), the frame that also names its function, from any call-site field of the record:
    one field may say where (``at``) and another the whole stack (``candidates``)."""
    frames = [f for v in record.values() if _is_sites(v) for f in (v if isinstance(v, list) else [v])]
    return {(f.get("file"), f.get("line")): f for f in frames if f.get("function")}


def _is_ranks(value: Any) -> bool:
    def is_rank(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    return is_rank(value) or (isinstance(value, list) and bool(value) and all(is_rank(v) for v in value))


def _names(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return _items([f"`{v}`" for v in value], str)
    return format_value(value)


def _repeats(pairs: Any) -> str:
    """``pass 2 = pass 1`` for each (pass, earlier pass) pair."""
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        return format_value(pairs)
    return _items(pairs, lambda p: f"pass {p[0]} = pass {p[1]}")


def _compared(value: Any) -> str:
    return {"grads": "gradients", "params": "parameters"}.get(value, format_value(value))




_UNIT_SUFFIXES = ("_s", "_bytes", "_gbps", "_pct")

# How a field's value reads, by the unit its declaration names (FieldInfo.unit).
UNITS: dict[str, Formatter] = {
    "s": lambda v: seconds(float(v)),
    "bytes": size,
    "gbps": lambda v: f"{number(v)} GB/s",
    "pct": lambda v: f"{number(v)} %",
    "fraction": percent,
    "times": lambda v: f"{number(v)}x",
    "ranks": ranks_text,
    "rank": lambda v: f"rank {v}",
    "code": lambda v: f"`{v}`",
    "names": _names,
    "site": site_text,
    "pass-pairs": lambda v: _rank_map(v, _repeats) if _is_rank_map(v) else format_value(v),
    "grads-or-params": _compared,
}


def _label_of(key: Any) -> str:
    """The key's label, or the key in words without its unit suffix (the value carries the unit)."""
    name = str(key)
    nested = _NESTED.get().get(name)
    if nested:
        return nested
    for suffix in _UNIT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")


def evidence_rows(evidence: Union[EvidenceRecord, Mapping[str, Any]], *,
                  limit: int = 12) -> list[tuple[str, list[str]]]:
    """(label, lines) per shown field, in the check's order: each field's label and unit come from its
    declaration (:func:`~ddpdoctor.schema.findings.evidence_field`); a plain dict's keys read by the shape
    of their values. A list of records, a map of named entries (iterations without a gradient per
    parameter) or a rank map of records give one line per item; anything else one line."""
    rows: list[tuple[str, list[str]]] = []
    for key, value, info in as_evidence(evidence).rows():
        if info.hidden or _absent(value) or key in RAW_KEYS:
            continue
        label = info.label or _label_of(key)
        fmt = UNITS.get(info.unit) if info.unit else None
        if fmt is not None:
            lines = [fmt(value)]
        else:
            with _nested(info):
                lines = _lines(value, key)
        rows.append((label, lines))
        if len(rows) >= limit:
            break
    return rows


# Units of evidence fields the terminal and the HTML page draw as pictures, not rows (declare them
# hidden): where each rank was (rank -> {state, waiting_in, stalled_s, last_collective, where}), each
# rank's call of a collective (rank -> {op, phase, tensors, site}), the last collectives of every rank
# (rank -> {sequence number: the call in words}) and the sequence number of the first that differed.
RANK_STATES = "rank-states"
RANK_CALLS = "rank-calls"
COLLECTIVE_TIMELINE = "collective-timeline"
DIVERGENCE = "divergence"
VIEW_UNITS = frozenset({RANK_STATES, RANK_CALLS, COLLECTIVE_TIMELINE, DIVERGENCE})

@dataclass(frozen=True)
class EvidenceViews:
    """The fields of a finding's evidence drawn as pictures, found by their declared unit, as the JSON
    report has them (a live report and the same report read back draw alike); None where it has none."""

    states: Optional[Mapping[str, Any]] = None
    calls: Optional[Mapping[str, Any]] = None
    timeline: Optional[Mapping[str, Any]] = None
    divergence: Optional[int] = None
    stall: bool = False  # the states were taken during a stall that resolved, not when the job was stopped

    def states_when(self, stopped: str) -> str:
        """When the ranks' states were taken, for the heading of their picture."""
        return "during the stall" if self.stall else stopped


def evidence_views(evidence: Union[EvidenceRecord, Mapping[str, Any]]) -> EvidenceViews:
    """The evidence's views (the first field of each view unit)."""
    record = as_evidence(evidence)
    keys: dict[str, str] = {}
    for key, _, info in record.rows():
        if info.unit in VIEW_UNITS:
            keys.setdefault(info.unit, key)
    if not keys:
        return EvidenceViews()
    data = record.to_json()

    def mapping(unit: str) -> Optional[Mapping[str, Any]]:
        value = data.get(keys[unit]) if unit in keys else None
        return value if isinstance(value, dict) else None

    divergence = data.get(keys[DIVERGENCE]) if DIVERGENCE in keys else None
    return EvidenceViews(states=mapping(RANK_STATES), calls=mapping(RANK_CALLS), timeline=mapping(COLLECTIVE_TIMELINE),
                         divergence=divergence if isinstance(divergence, int) and not isinstance(divergence, bool)
                         else None, stall=data.get("kind") == HangKind.STALL.value)


def _lines(value: Any, key: str) -> list[str]:
    """A value as the lines of one evidence row."""
    if isinstance(value, list) and any(_is_record(v) or _is_phrase(v) for v in value):
        return _record_lines(value) if any(_is_record(v) for v in value) else _capped([str(v) for v in value])
    if _is_rank_map(value) and any(_is_record(v) for v in value.values()):
        groups = _rank_groups(value, lambda v: format_value(v, key, depth=1))
        return _capped([f"{ranks_text(ranks)}: {text}" for text, ranks in groups])
    if _is_record(value) and all(_is_record(v) or _is_rank_map(v) for v in value.values()):
        return _capped([f"{k}: {format_value(v, key, depth=1)}" for k, v in value.items()])
    return [format_value(value, key)]


def _is_phrase(value: Any) -> bool:
    """Text that carries its own label (``lr: rank 0: 0.1``): a line of its own, never joined with commas."""
    return isinstance(value, str) and (": " in value or "; " in value)


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_LINES:
        return lines
    return lines[:MAX_LINES] + [f"… ({len(lines) - MAX_LINES} more)"]
