"""The causality pass: one bug, one finding. A finding another one explains becomes its consequence.

The engine only: the rules are declared by the checks that are causes (``Check(explains=...)``, see
:class:`~ddpdoctor.analysis.api.Explains`), in terms of symptom kinds (ddpdoctor.analysis.symptoms).
Rules are tried lowest priority first; a link that would close a cycle is skipped; chains are
flattened, so every consequence hangs under its root. Consequences never reach the top level or the
exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from ddpdoctor.analysis.api import Explains, Finding

if TYPE_CHECKING:
    from ddpdoctor.analysis.registry import LoadedCheck

__all__ = ["Rule", "rules_of", "rules_for", "installed_rules", "link"]

Predicate = Callable[[Finding], bool]


@dataclass(frozen=True)
class Rule:
    name: str
    cause: Predicate
    explains: Callable[[Finding, Finding], bool]  # (candidate symptom, cause) -> explained?
    priority: int = 1000


def rules_of(declared: Iterable[tuple[str, Explains]]) -> tuple[Rule, ...]:
    """The rules (check id, Explains) pairs declare, lowest priority first: a rule's causes are that
    check's findings for which its ``cause`` holds."""
    rules = [Rule(name=e.name, cause=_of_check(check_id, e.cause), explains=e.symptom, priority=e.priority)
             for check_id, e in declared]
    return tuple(sorted(rules, key=lambda r: r.priority))


def rules_for(checks: Iterable[LoadedCheck]) -> tuple[Rule, ...]:
    """The rules these loaded checks declare (a broken one declares none)."""
    return rules_of((c.id, e) for c in checks if c.check is not None for e in c.check.explains)


def _of_check(check_id: str, cause: Predicate) -> Predicate:
    return lambda finding: finding.check == check_id and cause(finding)


def _root(links: dict[int, int], index: int) -> int:
    seen = {index}
    while index in links:
        index = links[index]
        if index in seen:
            break
        seen.add(index)
    return index


def installed_rules() -> tuple[Rule, ...]:
    """The rules every loadable check declares (built-ins and plugins)."""
    from ddpdoctor.analysis.registry import load_checks

    return rules_for(load_checks())


def link(findings: list[Finding], rules: Optional[tuple[Rule, ...]] = None) -> list[Finding]:
    """Top-level findings with their consequences attached; order of the roots is kept. ``rules``:
    those of the installed checks unless given."""
    if rules is None:
        rules = installed_rules()
    links: dict[int, int] = {}  # symptom index -> cause index
    for rule in rules:
        for i, cause in enumerate(findings):
            if not rule.cause(cause):
                continue
            for j, symptom in enumerate(findings):
                if j == i or j in links or not rule.explains(symptom, cause):
                    continue
                if _root(links, i) == j:  # j already (indirectly) causes i: no cycles
                    continue
                links[j] = i
    attached: dict[int, list[int]] = {}
    for j in sorted(links):
        attached.setdefault(_root(links, j), []).append(j)
    roots = []
    for i, finding in enumerate(findings):
        if i in links:
            continue
        symptoms = [findings[j] for j in attached.get(i, [])]
        extra = tuple(c for s in symptoms for c in (s.as_consequence(), *s.consequences))
        roots.append(replace(finding, consequences=finding.consequences + extra) if extra else finding)
    return roots
