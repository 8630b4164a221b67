"""The suite's own layout: tests/ has no __init__.py, so pytest imports each test module by its base
name, and two test files of one name in different folders fail at collection ("import file mismatch")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if "data" not in path.parts)
    assert [name for name, count in names.items() if count > 1] == []
