"""Each known-bad fixture is reported as exactly its root cause, with its other symptoms as
consequences (the known-good fixtures are in test_known_good_fixtures.py).

Real torchrun, 2 gloo ranks on CPU, assertions through the JSON report.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

pytestmark = pytest.mark.integration

# fixture -> ({check: severity} of the top-level findings, exactly (no info either);
#             the checks of its consequences, exactly)
KNOWN_BAD = {
    "bad_grad_no_ddp.py": ({"gradient-sync": "error"}, {"not-distributed"}),
    "bad_grad_bypass.py": ({"gradient-sync": "error"}, set()),
    "bad_grad_bypass_batchnorm.py": ({"gradient-sync": "error"}, {"buffer-sync"}),
    "bad_grad_step_in_no_sync.py": ({"gradient-sync": "error"}, set()),
    "bad_params_modified.py": ({"gradient-sync": "error"}, set()),
    "bad_buffer_sync.py": ({"buffer-sync": "warning"}, set()),
    # The overlapping samples' content, seen again by the content audit, is the same bug.
    "bad_sampler_no_distributed.py": ({"sampler-disjoint": "error"}, {"sampler-disjoint"}),
    "bad_sampler_rank_seed.py": ({"sampler-disjoint": "error"}, {"sampler-disjoint"}),
    "bad_sampler_wrong_replicas.py": ({"sampler-disjoint": "error"}, set()),
    "bad_sampler_batch_sampler_workers.py": ({"sampler-disjoint": "error"}, {"sampler-disjoint"}),
    "bad_set_epoch.py": ({"set-epoch": "warning"}, set()),
    # DDP raises "Expected to have finished reduction" (rank-failure) and the gradients differ.
    "bad_unused_missing.py": ({"unused-parameters": "error"}, {"rank-failure", "gradient-sync"}),
    "bad_unused_lightning_message.py": ({"unused-parameters": "error"}, {"rank-failure", "gradient-sync"}),
    "bad_unused_needless.py": ({"unused-parameters": "warning"}, set()),
    "bad_no_process_group.py": ({"not-distributed": "error"}, {"sampler-disjoint"}),
    # The rank left alone in DDP's collectives (collective-hang) and its crash when the peer left.
    "uneven_shards_crash.py": ({"uneven-inputs": "error"}, {"rank-failure", "collective-hang"}),
    "mismatch_allgather_sizes.py": ({"collective-hang": "error"}, {"rank-failure"}),
    "hang_metric_allreduce_in_loop.py": ({"collective-hang": "error"}, {"rank-failure"}),
    "crash_at_import.py": ({"rank-failure": "error"}, set()),
    "crash_before_training.py": ({"rank-failure": "error"}, set()),
    "bad_config_eval_rank0.py": ({"config-sync": "error"}, set()),
    "bad_config_lr_by_rank.py": ({"config-sync": "error"}, {"gradient-sync"}),
    "bad_optimizer_ema_copy.py": ({"optimizer-params": "error"}, set()),
    "bad_optimizer_new_head.py": ({"optimizer-params": "error"}, set()),
    "bad_optimizer_weights_restored.py": ({"optimizer-params": "error"}, set()),
    "bad_grad_bf16_round_trip.py": ({"gradient-sync": "error"}, set()),
    "bad_grad_device_round_trip.py": ({"gradient-sync": "error"}, set()),
    "bad_grad_ddp_rewrap.py": ({"gradient-sync": "error"}, set()),
    "bad_grad_comm_hook.py": ({"gradient-sync": "error"}, set()),
    "bad_grad_comm_hook_late.py": ({"gradient-sync": "error"}, set()),
}

# fixture -> consequences a run may also attach, by timing. Rank 0's stray all_reduce pairs with rank 1's
# next gradient all-reduce: whether rank 1 counted one more batch before both blocked depends on when
# each rank's last events were written, and that uneven count is the hang's consequence when it is.
MAY_ALSO = {"hang_metric_allreduce_in_loop.py": {"uneven-inputs"}}

GRADIENT_CASES = {
    "bad_grad_no_ddp.py": "not-wrapped",
    "bad_grad_bypass.py": "ddp-bypassed",
    "bad_grad_bypass_batchnorm.py": "ddp-bypassed",
    "bad_grad_step_in_no_sync.py": "step-in-no-sync",
    "bad_params_modified.py": "params-modified",
    "bad_grad_bf16_round_trip.py": "converted-after-wrap",
    "bad_grad_ddp_rewrap.py": "ddp-rewrapped",
    "bad_grad_comm_hook.py": "comm-hook",
    "bad_grad_comm_hook_late.py": "comm-hook",
}

def _options(fixture: str) -> tuple:
    return ("--hang-timeout", "5") if fixture.startswith(("hang_", "uneven_", "mismatch_")) else ()


@pytest.mark.parametrize("fixture", sorted(KNOWN_BAD))
def test_known_bad_fixture_reports_exactly_its_root_cause(run_check, fixture):
    roots, consequences = KNOWN_BAD[fixture]
    run = run_check(fixture, *_options(fixture))
    assert run.report is not None, run.output
    assert run.returncode == 1, run.output[-3000:]
    assert run.found() == set(roots.items()), (run.found(), run.output[-3000:])
    (root,) = roots
    attached = {c["check"] for c in run.consequences(root)}
    assert consequences <= attached <= consequences | MAY_ALSO.get(fixture, set()), (attached, run.output[-3000:])
    statuses = {c["id"]: c["status"] for c in run.report["checks"]}
    assert statuses[root] == ("fail" if roots[root] == "error" else "warn")
    for check_id in attached - {root}:
        assert statuses[check_id] in ("pass", "skip"), "a consequence never fails its own check"


@pytest.mark.parametrize("fixture", sorted(GRADIENT_CASES))
def test_gradient_sync_names_the_case_step_and_parameter(run_check, fixture):
    run = run_check(fixture)
    (finding,) = run.findings("gradient-sync")
    assert finding["evidence"]["case"] == GRADIENT_CASES[fixture]
    assert finding["evidence"]["step"] >= 1
    assert finding["evidence"]["parameter"]
    assert finding["ranks"] == [0, 1]
    assert finding["location"] is not None and finding["location"]["file"].startswith(str(FIXTURES))


@pytest.mark.parametrize("fixture", ["bad_unused_missing.py", "bad_unused_lightning_message.py"])
def test_unused_missing_names_the_parameters(run_check, fixture):
    run = run_check(fixture)
    (finding,) = run.findings("unused-parameters", "error")
    assert finding["evidence"]["unused"] == ["aux_head.weight", "aux_head.bias"]
    assert finding["evidence"]["crashed_ranks"] == [0, 1]


def test_crash_names_rank_exception_and_line(run_check):
    run = run_check("bad_raise_on_rank1.py")  # the fault matrix's run (test_hangs_and_faults.py)
    assert run.returncode == 1
    (finding,) = run.findings("rank-failure", "error")
    assert finding["ranks"] == [1]
    assert "ValueError" in finding["message"] and "bad batch" in finding["message"]
    assert finding["location"]["file"].endswith("bad_raise_on_rank1.py")
    assert finding["location"]["line"] == _line_of("bad_raise_on_rank1.py", 'raise ValueError("bad batch")')


@pytest.mark.parametrize("fixture, marker", [
    ("crash_at_import.py", "import ddpdoctor_fixture_module_that_does_not_exist"),
    ("crash_before_training.py", "torch.load("),
])
def test_the_same_crash_on_every_rank_is_one_cause_on_all_ranks(run_check, fixture, marker):
    run = run_check(fixture)
    (finding,) = run.findings("rank-failure", "error")
    assert finding["ranks"] == [0, 1]
    assert finding["message"].startswith("every rank (0, 1) raised")
    assert finding["location"]["line"] == _line_of(fixture, marker)
    assert {c["id"]: c["status"] for c in run.report["checks"]}["not-distributed"] == "skip"


def test_allgather_size_mismatch_names_the_op_the_sizes_and_the_line(run_check):
    run = run_check("mismatch_allgather_sizes.py", "--hang-timeout", "5")
    (finding,) = run.findings("collective-hang", "error")
    assert "all_gather of float32[4]" in finding["message"] and "all_gather of float32[5]" in finding["message"]
    assert finding["location"]["line"] == _line_of("mismatch_allgather_sizes.py", "dist.all_gather(")


def test_uneven_shards_name_the_batch_counts_and_explain_the_peers_crash(run_check):
    run = run_check("uneven_shards_crash.py", "--hang-timeout", "5")
    (finding,) = run.findings("uneven-inputs", "error")
    assert finding["evidence"]["cause"] == "data"
    assert finding["evidence"]["batches"] == {"0": 10, "1": 9}
    (crash,) = [c for c in finding["consequences"] if c["check"] == "rank-failure"]
    assert crash["ranks"] == [0]


def _line_of(fixture: str, text: str) -> int:
    for number, line in enumerate((FIXTURES / fixture).read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {fixture}")
