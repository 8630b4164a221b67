"""Each known-good fixture (patterns real training code uses) stays clean: no warning, no error,
no probe error, exit 0. Real torchrun, 2 gloo ranks on CPU, assertions through the JSON report.

Apart from the known-bad fixtures (test_checks_on_fixtures.py) so the two halves run in parallel.
"""

from __future__ import annotations

import pytest
from conftest import ddpdoctors_own

pytestmark = pytest.mark.integration

KNOWN_GOOD = [
    "good_no_sync_accumulation.py",
    "good_rank_seeded_init.py",
    "good_dropout.py",
    "good_allreduce_metrics.py",
    "good_unused_sometimes.py",
    "good_batchnorm.py",
    "good_gan.py",
    "good_actor_critic.py",
    "good_teacher_student.py",
    "good_zero_optimizer.py",
    "good_subgroup_collectives.py",
    "good_random_split_sampler.py",
    "good_even_batches_padding.py",
    "good_dispatch_batches.py",
    "good_local_reference_model.py",
    "good_closure_step.py",
    "good_eval_rank0_restores_train.py",
    "good_scheduler_every_rank.py",
    "good_freeze_unfreeze.py",
    "good_ema_copy.py",
    "good_lr_zero_group.py",
]


@pytest.mark.parametrize("fixture", KNOWN_GOOD)
def test_known_good_fixture_is_clean(run_check, fixture):
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.serious() == [], run.serious()
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    ours = ddpdoctors_own(run.temp_left)
    assert ours == [], f"a clean run leaves nothing of ddpdoctor's in the temporary directory: {ours}"


def test_a_slow_rank_outside_communication_is_not_a_hang(run_check):
    run = run_check("good_slow_rank.py", "--hang-timeout", "3")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.serious() == []
    (stall,) = run.findings("collective-hang", "info")
    assert stall["evidence"]["ranks"]["0"]["state"] == "busy"
    assert "DataLoader" in stall["evidence"]["ranks"]["0"]["waiting_in"]
