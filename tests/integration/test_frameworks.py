"""Framework code (Accelerate, Lightning's Trainer): no false alarm on the loops their examples
teach, the framework named in the report, and fixes in the framework's own words (issue #16).

The frameworks are test extras (pyproject.toml); they install beside torch 2.13 CPU.
"""

from __future__ import annotations

import importlib.util

import pytest
from conftest import skip_or_fail_in_ci

pytestmark = [pytest.mark.integration, pytest.mark.realcode]

# fixture -> (framework module, report name, {check: severity} of the roots, words the root's fix must contain)
FIXTURES = {
    "good_accelerate.py": ("accelerate", "Accelerate", {}, ()),
    "bad_accelerate_unused.py": ("accelerate", "Accelerate", {"unused-parameters": "error"},
                                 ("DistributedDataParallelKwargs(find_unused_parameters=True)", "accelerator.prepare")),
    "good_lightning.py": ("lightning", "Lightning Trainer", {}, ()),
    "bad_lightning_save_every_rank.py": ("lightning", "Lightning Trainer", {"rank0-checkpoint": "error"},
                                         ("trainer.save_checkpoint", "is_global_zero")),
}


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_framework_fixture(run_check, fixture):
    module, title, roots, words = FIXTURES[fixture]
    if importlib.util.find_spec(module) is None:
        skip_or_fail_in_ci(f"{module} is not installed (it is in the test extras: pip install -e '.[test]')")
    # The default (adaptive) threshold: none of these jobs hangs, and a short one reported the slow
    # import of a framework on a loaded machine as a stall (an info finding).
    run = run_check(fixture)
    assert run.report is not None, run.output[-3000:]
    assert run.found() == set(roots.items()), (run.findings(), run.output[-3000:])
    assert run.returncode == (1 if roots else 0), run.output[-3000:]
    assert run.report["framework"]["title"] == title and run.report["framework"]["version"]
    for check in roots:
        (finding,) = run.findings(check, roots[check])
        assert all(word in finding["fix"] for word in words), finding["fix"]
    if not roots:
        assert run.report["probe_errors"] == []
