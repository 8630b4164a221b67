"""Each known-good fixture (patterns real training code uses) stays clean: no warning, no error,
exactly the info findings named for it, no probe error, exit 0. Real torchrun, 2 gloo ranks on
CPU, assertions through the JSON report.

Apart from the known-bad fixtures (test_checks_on_fixtures.py) so the two halves run in parallel.
"""

from __future__ import annotations

import pytest
from conftest import ddpdoctors_own

pytestmark = pytest.mark.integration

# fixture -> the info findings it must show, exactly (nothing at warning or error, ever)
KNOWN_GOOD = {
    "good_no_sync_accumulation.py": set(),
    "good_rank_seeded_init.py": set(),
    "good_dropout.py": set(),
    "good_allreduce_metrics.py": set(),
    # A parameter that gets no gradient on some iterations: find_unused_parameters=True is needed, as set.
    "good_unused_sometimes.py": {"unused-parameters"},
    "good_batchnorm.py": set(),
    "good_gan.py": set(),
    "good_actor_critic.py": set(),
    "good_teacher_student.py": set(),
    "good_zero_optimizer.py": set(),
    "good_subgroup_collectives.py": set(),
    # The sampler pads an uneven dataset so every rank gets the same count: info for a training loader.
    "good_random_split_sampler.py": {"sampler-disjoint"},
    "good_even_batches_padding.py": {"sampler-disjoint"},
    "good_dispatch_batches.py": set(),
    "good_local_reference_model.py": set(),
    "good_closure_step.py": set(),
    "good_eval_rank0_restores_train.py": set(),
    "good_scheduler_every_rank.py": set(),
    # The backbone frozen for an epoch gets no gradient: find_unused_parameters=True is needed, as set.
    "good_freeze_unfreeze.py": {"unused-parameters"},
    "good_ema_copy.py": set(),
    "good_lr_zero_group.py": set(),
}


@pytest.mark.parametrize("fixture", sorted(KNOWN_GOOD))
def test_known_good_fixture_is_clean(run_check, fixture):
    run = run_check(fixture)
    assert run.report is not None, run.output
    assert run.found() == {(check, "info") for check in KNOWN_GOOD[fixture]}, run.findings()
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.report["probe_errors"] == []
    ours = ddpdoctors_own(run.temp_left)
    assert ours == [], f"a clean run leaves nothing of ddpdoctor's in the temporary directory: {ours}"


def test_a_slow_rank_outside_communication_is_not_a_hang(run_check):
    run = run_check("good_slow_rank.py", "--hang-timeout", "3")
    assert run.returncode == 0, run.output[-3000:]
    assert run.report["outcome"] == "completed"
    assert run.found() == {("collective-hang", "info")}
    (stall,) = run.findings("collective-hang", "info")
    assert stall["evidence"]["ranks"]["0"]["state"] == "busy"
    assert "DataLoader" in stall["evidence"]["ranks"]["0"]["waiting_in"]
