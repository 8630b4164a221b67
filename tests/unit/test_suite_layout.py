"""The suite's own layout: tests/ has no __init__.py, so pytest imports each test module by its base
name, and two test files of one name in different folders fail at collection ("import file mismatch")."""

from __future__ import annotations

import runpy
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if "data" not in path.parts)
    assert [name for name, count in names.items() if count > 1] == []


def test_the_longest_first_modules_exist():
    """A module renamed or removed must leave tests/conftest.py's schedule too, or its place is lost
    without a word and the long module it named starts wherever collection puts it."""
    suite_conftest = runpy.run_path(str(TESTS / "conftest.py"))  # by path: tests/integration has a conftest too
    names = {path.name for path in TESTS.rglob("test_*.py") if "data" not in path.parts}
    assert [name for name in suite_conftest["LONGEST_FIRST"] if name not in names] == []
