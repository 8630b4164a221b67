"""A check's identity lives in its own module: no other module of ddpdoctor spells a built-in check's
id (issue #31). The order, the probes a check reads, what it judges and what it explains are
declared on its Check; the rest of the code asks the checks."""

from __future__ import annotations

import ast
from pathlib import Path

from ddpdoctor.analysis.registry import load_checks

ROOT = Path(__file__).resolve().parents[2]


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_no_module_but_its_own_spells_a_check_id():
    owners = {c.id: c.check.analyze.__module__.rsplit(".", 1)[-1] for c in load_checks() if c.check is not None}
    assert len(owners) == 15
    spelled = []
    for path in sorted([*(ROOT / "ddpdoctor").rglob("*.py"), *(ROOT / "checks").glob("*.py")]):
        for check_id in _string_constants(path) & set(owners):
            if not (path.parent.name == "checks" and path.stem == owners[check_id]):
                spelled.append(f"{path.relative_to(ROOT)}: {check_id!r}")
    assert spelled == []


def test_every_builtin_check_declares_its_order_and_evidence():
    checks = [c.check for c in load_checks() if c.check is not None]
    assert sorted(c.order for c in checks) == [c.order for c in checks]
    assert all(c.order < 1000 and c.evidence for c in checks)
