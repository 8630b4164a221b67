"""A third-party check takes part in the causality pass through the same API the built-ins use: its
findings can be the root cause of a built-in check's (recognised by their kind of evidence), and a
built-in cause explains a plugin's finding whose evidence is of a kind it explains."""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Explains, Finding, evidence_field
from ddpdoctor.analysis.causality import link, rules_of
from ddpdoctor.analysis.registry import load_checks
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.analysis.symptoms import RankFailed

from builders import failure, make_evidence

BUILTIN = [c for c in load_checks() if c.check is not None]


@dataclass(frozen=True)
class DiskFull(EvidenceRecord):
    path: str = evidence_field(default="", label="checkpoint path")


@dataclass(frozen=True)
class PeerLost(EvidenceRecord, RankFailed):
    rank: int = evidence_field(default=0, hidden=True)
    secondary_only: bool = evidence_field(default=True, hidden=True)


def _crash_after_disk_full(symptom: Finding, _cause: Finding) -> bool:
    return isinstance(symptom.evidence, RankFailed)


PLUGIN = Check(id="acme-disk", title="disk space", docs="", analyze=lambda e: CheckResult(), evidence=(DiskFull,),
               explains=(Explains("a full disk crashed a rank", _crash_after_disk_full, priority=5),))


def _finding(check: str, evidence: EvidenceRecord) -> Finding:
    return Finding(check=check, severity="error", message=f"{check} says", fix="fix", evidence=evidence)


def test_a_plugin_finding_is_the_root_cause_of_a_builtin_one():
    crash = Finding.from_json({"check": "rank-failure", "severity": "error", "message": "rank 1 raised OSError",
                               "fix": "fix", "evidence": {"rank": 1, "ranks": [1], "kind": "exception",
                                                          "secondary_only": False}})
    disk = _finding("acme-disk", DiskFull(path="/ckpt"))
    (root,) = link([crash, disk], rules_of([("acme-disk", e) for e in PLUGIN.explains]))
    assert root.check == "acme-disk" and [c.check for c in root.consequences] == ["rank-failure"]


def test_a_builtin_cause_explains_a_plugin_finding_of_a_kind_it_explains():
    """uneven-inputs (a rank ran out of data) explains a peer's failure, whoever reports it."""
    uneven = Finding.from_json({"check": "uneven-inputs", "severity": "error", "message": "rank 0 ran out",
                                "fix": "fix", "evidence": {"cause": "data", "batches": {"0": 3, "1": 4}}})
    peer = _finding("acme-peers", PeerLost(rank=1))
    rules = rules_of((c.id, e) for c in BUILTIN for e in c.check.explains)
    (root,) = link([uneven, peer], rules)
    assert root.check == "uneven-inputs" and [c.check for c in root.consequences] == ["acme-peers"]


def test_the_runner_takes_a_plugins_rules_from_its_check():
    """A crashed rank and a plugin's finding that explains it: one root, the plugin's."""
    from ddpdoctor.analysis.registry import LoadedCheck

    loaded = [c for c in load_checks() if c.id == "rank-failure"]
    finding_check = Check(id="acme-disk", title="disk", docs="", evidence=(DiskFull,), explains=PLUGIN.explains,
                          analyze=lambda e: CheckResult(findings=[_finding("acme-disk", DiskFull(path="/ckpt"))]))
    evidence = make_evidence(2, failures=[failure(1)])
    analysis = analyze(evidence, [*loaded, LoadedCheck(id="acme-disk", check=finding_check)])
    assert [(f.check, [c.check for c in f.consequences]) for f in analysis.findings] == [
        ("acme-disk", ["rank-failure"])]
