"""FSDP's collectives in the per-rank trace (issue #32, item 3): its all-gathers and reduce-scatters
are traced at the user's line and numbered like every collective, so hangs under FSDP are diagnosed
as under DDP. Uneven inputs under FSDP hang in the next all-gather: uneven-inputs is the cause, the
hang its consequence."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

FIXTURE = "hang_fsdp_uneven_inputs.py"
FORWARD_LINE = 30  # loss = nn.functional.cross_entropy(model(x), y)
BACKWARD_LINE = 31  # loss.backward()
BARRIER_LINE = 33  # dist.barrier(), after the loop


def test_fsdp_collectives_are_matched_across_ranks(run_check):
    """Four steps on both ranks (stopped before the uneven fifth): two sharded layers, so each step
    all-gathers twice in the forward, twice in the backward, and reduce-scatters twice."""
    run = run_check(FIXTURE, "--max-steps", "4")
    assert run.report["outcome"] == "completed", run.output[-3000:]
    (hang,) = [c for c in run.report["checks"] if c["id"] == "collective-hang"]
    assert hang["status"] == "pass"
    assert hang["summary"] == "48 collectives matched across ranks (48 of them FSDP's)"


def test_uneven_inputs_under_fsdp_hang_in_the_next_all_gather(run_check):
    """Under device simulation (the default here) FSDP's mesh gets a gloo group of its own: rank 0
    waits in that group's all-gather, rank 1 in the world group's barrier."""
    run = run_check(FIXTURE, "--hang-timeout", "5")
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["outcome"] == "hung"
    # diagnosed as under DDP: the uneven inputs are the cause, the hang their consequence
    assert run.found() == {("uneven-inputs", "error")}, run.findings()
    (uneven,) = run.findings("uneven-inputs", "error")
    assert uneven["evidence"]["batches"] == {"0": 5, "1": 4} and uneven["evidence"]["cause"] == "data"
    assert "Join does not support" in uneven["fix"]
    (hang,) = [c for c in uneven["consequences"] if c["check"] == "collective-hang"]
    assert hang["location"]["line"] == BARRIER_LINE  # as for DDP's uneven inputs: the line only rank 1 ran
    states = hang["evidence"]["ranks"]
    assert {r: s["state"] for r, s in states.items()} == {"0": "waiting", "1": "waiting"}
    assert states["0"]["waiting_in"] == "all_gather_single #25 in FSDP's forward"
    assert states["0"]["where"]["line"] == FORWARD_LINE
    assert states["0"]["last_collective"]["op"] == "all_gather_single"
    assert states["0"]["last_collective"]["site"]["line"] == FORWARD_LINE
    assert states["1"]["waiting_in"] == "barrier #1"
    assert "rank 0 waits in all_gather_single #25 in FSDP's forward at hang_fsdp_uneven_inputs.py:30" \
        in hang["message"]


def test_on_the_world_group_the_divergence_is_fsdps_all_gather_against_the_barrier(run_check):
    """Without simulation FSDP's mesh is the world group: its collectives share the backend's
    numbering with the barrier, and the ranks part at rank 0's 25th collective."""
    run = run_check(FIXTURE, "--hang-timeout", "5", "--device", "native")
    assert run.report["outcome"] == "hung", run.output[-3000:]
    assert run.found() == {("uneven-inputs", "error")}, run.findings()
    (hang,) = [c for c in run.findings("uneven-inputs", "error")[0]["consequences"] if c["check"] == "collective-hang"]
    evidence = hang["evidence"]
    assert evidence["first_divergence"] == 25
    assert evidence["timeline"]["0"]["25"] == ("all_gather_single of float32[272] in FSDP's forward at "
                                               f"hang_fsdp_uneven_inputs.py:{FORWARD_LINE}")
    assert evidence["timeline"]["1"]["25"] == f"barrier at hang_fsdp_uneven_inputs.py:{BARRIER_LINE}"
    assert evidence["timeline"]["1"]["24"] == (f"reduce_scatter_single of float32[272] in FSDP's backward at "
                                               f"hang_fsdp_uneven_inputs.py:{BACKWARD_LINE}")
    assert hang["location"]["line"] == BARRIER_LINE


GATHER_FIXTURE = "hang_fsdp2_gather_rank0_only.py"
GATHER_LINE = 34  # full = get_model_state_dict(...), under `if rank == 0:`
GATHER_BARRIER_LINE = 36  # dist.barrier()


def test_a_full_state_dict_gathered_on_rank_0_only_hangs_in_the_gather_not_in_a_backward(run_check):
    """get_model_state_dict is a collective: on rank 0 alone it blocks in a DTensor redistribute's
    all-gather, whose forward runs in `torch/autograd/function.py apply`; that frame is no backward."""
    run = run_check(GATHER_FIXTURE, "--hang-timeout", "5")
    assert run.report["outcome"] == "hung", run.output[-3000:]
    assert run.found() == {("collective-hang", "error")}, run.findings()
    (hang,) = run.findings("collective-hang", "error")
    states = hang["evidence"]["ranks"]
    assert {r: s["state"] for r, s in states.items()} == {"0": "waiting", "1": "waiting"}
    assert states["0"]["waiting_in"] == "a torch.distributed call (wait_tensor)"
    assert states["0"]["where"]["line"] == GATHER_LINE
    assert states["1"]["waiting_in"] == "barrier #1"
    assert states["1"]["where"]["line"] == GATHER_BARRIER_LINE
    assert "backward" not in hang["message"]
    assert (f"rank 0 waits in a torch.distributed call (wait_tensor) at {GATHER_FIXTURE}:{GATHER_LINE}"
            in hang["message"])
