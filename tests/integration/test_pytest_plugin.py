"""The ``ddpdoctor`` pytest fixture, used the way a user would: a test file in a fresh directory,
run by a separate pytest that loads the plugin through its ``pytest11`` entry point."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

USER_TESTS = f"""
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FIXTURES = Path({str(FIXTURES)!r})


def ddp_steps(bypass_ddp):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 4) + dist.get_rank()  # every rank its own data
        optimizer.zero_grad()
        (model.module(x) if bypass_ddp else model(x)).sum().backward()
        optimizer.step()
    print(f"rank {{dist.get_rank()}} done", flush=True)


def test_good_batchnorm(ddpdoctor):
    ddpdoctor.check(FIXTURES / "good_batchnorm.py").assert_clean()


def test_bad_set_epoch(ddpdoctor):
    ddpdoctor.check(FIXTURES / "bad_set_epoch.py", hang_timeout_s=60).assert_clean()


def test_ddp_steps(ddpdoctor):
    report = ddpdoctor.run(ddp_steps, False)
    assert report.outcome == "completed" and report.world_size == 2
    report.assert_clean()


def test_ddp_steps_bypassing_ddp(ddpdoctor):
    ddpdoctor.run(ddp_steps, True).assert_clean()


def test_a_lambda_is_refused_before_launching(ddpdoctor):
    with pytest.raises(TypeError, match="picklable module-level function"):
        ddpdoctor.run(lambda: None)


def test_an_unknown_option_is_a_type_error(ddpdoctor):
    with pytest.raises(TypeError, match="unknown ddpdoctor option.s. hang_timeout; known: .*hang_timeout_s"):
        ddpdoctor.check(FIXTURES / "good_batchnorm.py", hang_timeout=5)
"""


def test_the_ddpdoctor_fixture_checks_scripts_and_functions(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf", timeout=600)
    result.assert_outcomes(passed=4, failed=2)
    output = result.stdout.str()
    # bad_set_epoch fails with its finding, its location and the fix, and the rank output captured
    result.stdout.fnmatch_lines([
        "*test_bad_set_epoch*",
        "E *AssertionError: ddpdoctor: 1 finding(s) at or above warning (outcome completed):",
        f"E *WARNING set-epoch at {FIXTURES / 'bad_set_epoch.py'}:*: *set_epoch*",
        "E *fix: Call `sampler.set_epoch(epoch)`*",
    ])
    result.stdout.fnmatch_lines(["*test_ddp_steps_bypassing_ddp*", "E *ERROR gradient-sync at test_user.py:*: *",
                                 "E *fix: Call the DDP wrapper itself*"])
    captured = output.split("Captured stdout call")[-1]  # the rank output of the last failure
    assert "[rank0] rank 0 done" in captured and "[rank1] rank 1 done" in captured
    assert "FAILED test_user.py::test_bad_set_epoch" in output
    assert "FAILED test_user.py::test_ddp_steps_bypassing_ddp" in output
