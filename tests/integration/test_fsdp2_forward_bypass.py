"""A forward that bypasses FSDP2's hooks (issue #32): `module.forward(x)` on a module sharded with
fully_shard computes with its sharded DTensor parameters, and torch's "got mixed torch.Tensor and
DTensor" error is decoded into that cause and its fix."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

FIXTURE = "bad_fsdp2_forward_bypass.py"
BYPASS_LINE = 33  # logits = model.fc.forward(model.features(x))


def test_a_sharded_modules_forward_called_directly_is_decoded_into_the_bypassed_hooks(run_check):
    run = run_check(FIXTURE)
    assert run.returncode == 1 and run.report["outcome"] == "failed", run.output[-3000:]
    assert run.found() == {("rank-failure", "error")}, run.findings()
    (finding,) = run.findings("rank-failure", "error")
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] == BYPASS_LINE
    assert finding["evidence"]["decoded"]["code"] == "fsdp-hooks-bypassed"
    assert "ran without FSDP's pre-forward hook (its `.forward(x)` called directly)" in finding["message"]
    assert "aten.addmm.default got mixed torch.Tensor and DTensor" in finding["message"]
    assert finding["fix"].startswith("Call the module itself (`module(x)`), not `module.forward(x)`, so FSDP's "
                                     "hooks all-gather its parameters first;")
    assert finding["consequences"] == []
