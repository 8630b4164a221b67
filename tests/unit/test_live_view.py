"""The live view says what each rank really does, from synthetic heartbeats and stacks: waiting in a
collective (DDP's gradient all-reduce inside backward included) with a timer, computing, loading
data, saving a checkpoint, finished, crashed or killed; the start-up phases with a timer; the stall
counter against the hang threshold; steps and epochs as the ranks count them."""

from __future__ import annotations

import sys

from builders import frame

from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.rank.watchdog import LiveState, Watchdog, light_stack
from ddpdoctor.schema.observations import Heartbeat
from ddpdoctor.schema.rank_state import DDP_GRADIENT_ALLREDUCE, live_state
from ddpdoctor.schema.settings import RankSettings
from ddpdoctor.supervisor.live_view import duration, exit_text, header, rank_row

TORCH = "/venv/lib/python3.11/site-packages/torch"
NOW = 1_000.0


def beat(rank: int = 0, **fields) -> Heartbeat:
    defaults = {"pid": 100 + rank, "rank": rank, "world_size": 2, "host": "node1", "t": NOW - 0.2, "steps": 64}
    return Heartbeat(**{**defaults, **fields})


# -- the rank side: what the stack says -------------------------------------------------------------------

def user(line: int = 40, function: str = "train") -> dict:
    return frame(line, user=True, function=function)


def lib(path: str, function: str, code: str = "") -> dict:
    return {"file": f"{TORCH}/{path}", "line": 1, "function": function, "user": False, "code": code}


def test_a_traced_collective_is_waiting_in_it():
    assert live_state([user(), lib("distributed/distributed_c10d.py", "barrier")], "in barrier #4") == \
        ("waiting", "barrier #4")


def test_backward_is_computing_until_every_gradient_arrived_then_waits_for_ddp():
    stack = [user(82, "train_step"), lib("_tensor.py", "backward"), lib("autograd/__init__.py", "backward")]
    assert live_state(stack, "iterating data") == ("computing", "backward")
    assert live_state(stack, "iterating data", gradients_complete=True) == ("waiting", DDP_GRADIENT_ALLREDUCE)


def test_data_checkpoints_and_own_code():
    assert live_state([user(), lib("utils/data/dataloader.py", "__next__")]) == ("loading data", None)
    assert live_state([user(), lib("serialization.py", "save"), lib("serialization.py", "_save")]) == \
        ("saving a checkpoint", None)
    assert live_state([user(), lib("serialization.py", "load")]) == ("loading a checkpoint", None)
    assert live_state([user()]) == ("computing", None)
    assert live_state([user(), lib("nn/modules/conv.py", "forward")]) == ("computing", None)
    ddp = {"file": f"{TORCH}/nn/parallel/distributed.py", "line": 1, "function": "_sync_buffers", "user": False}
    assert live_state([user(), ddp]) == ("waiting", "DDP's buffer broadcast")
    assert live_state([user(), lib("distributed/distributed_c10d.py", "init_process_group")]) == \
        ("waiting", "a torch.distributed call (init_process_group)")


def test_the_watchdog_reads_the_main_threads_stack_and_times_the_state(tmp_path):
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    live = LiveState()
    rec.set_activity("in all_reduce #7")
    began = rec.activity_t
    first = live.sample(rec, None, NOW)
    assert first["state"] == "waiting" and first["detail"] == "all_reduce #7" and first["since"] == began
    assert live.sample(rec, None, NOW + 5)["since"] == began  # still the same wait: the timer runs on
    rec.set_activity("training")
    assert live.sample(rec, None, NOW + 6)["since"] == NOW + 6
    rec.exit_info = {"code": 1, "exception": "RuntimeError: CUDA error"}
    rec.set_activity("exited")
    ended = live.sample(rec, None, NOW + 7)
    assert (ended["state"], ended["detail"]) == ("crashed", "RuntimeError: CUDA error")
    rec.close()


def test_the_heartbeat_classifies_the_main_threads_stack_and_names_the_users_frame(tmp_path):
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    watchdog = Watchdog(rec)
    stack = light_stack(sys._getframe())
    assert stack[-1]["function"] == "test_the_heartbeat_classifies_the_main_threads_stack_and_names_the_users_frame"
    assert stack[-1]["user"] is True and "code" not in stack[-1]  # source text only for DDP's own frames
    now = watchdog.heartbeat()  # called on the main thread: its innermost user frame is this test
    assert now.state == "computing" and now.since is not None
    assert now.where["function"] == "test_the_heartbeat_classifies_the_main_threads_stack_and_names_the_users_frame"
    rec.close()


def test_beats_fall_on_wall_clock_ticks(tmp_path):
    """Every rank beats at the same instants: the next multiple of the interval, whatever the time now
    (a given instant, so no wall-clock window can make the test flaky)."""
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    watchdog = Watchdog(rec, interval_s=0.5)
    for now, expected in ((1000.0, 0.5), (1000.1, 0.4), (1000.49, 0.01), (1000.5, 0.5), (1000.75, 0.25)):
        wait = watchdog._until_next_tick(now)
        assert abs(wait - expected) < 1e-9 and 0 < wait <= 0.5
        assert abs((now + wait) / 0.5 - round((now + wait) / 0.5)) < 1e-9
    rec.close()


# -- the supervisor side: the words -----------------------------------------------------------------------

def test_waiting_in_a_collective_with_its_timer():
    row = rank_row(beat(state="waiting", detail="all_reduce #5", since=NOW - 3.24,
                        where={"file": "/job/train.py", "line": 40, "function": "train"},
                        last_collective={"op": "all_reduce", "n": 5}), NOW)
    assert row.doing == "waiting in all_reduce #5 for 3.2 s"
    assert row.where == "train.py:40 (train)" and row.last_collective == "#5 all_reduce" and not row.alarm


def test_a_rank_blocked_in_ddps_all_reduce_says_so_not_iterating_data():
    row = rank_row(beat(activity="iterating data", state="waiting", detail=DDP_GRADIENT_ALLREDUCE, since=NOW - 12),
                   NOW)
    assert row.doing == "waiting in DDP's gradient all-reduce (in backward) for 12 s" and row.alarm
    assert "iterating data" not in row.doing


def test_computing_loading_saving_finishing():
    assert rank_row(beat(state="computing", detail="backward", since=NOW), NOW).doing == "computing (backward)"
    assert rank_row(beat(state="loading data", since=NOW - 0.3), NOW).doing == "loading data"
    assert rank_row(beat(state="loading data", since=NOW - 2), NOW).doing == "loading data for 2.0 s"
    assert rank_row(beat(state="saving a checkpoint", since=NOW - 75), NOW).doing == \
        "saving a checkpoint for 1 min 15 s"
    assert rank_row(beat(state="finished"), NOW).doing == "finished"
    assert rank_row(beat(state="finished", detail="stopped at --max-steps"), NOW).doing == \
        "finished (stopped at --max-steps)"
    assert rank_row(beat(state="importing"), NOW).doing == "importing torch and the probes"


def test_a_crash_and_a_clean_end_look_different():
    crashed = rank_row(beat(state="crashed", detail="RuntimeError: Expected to have finished reduction"), NOW)
    assert crashed.doing == "crashed: RuntimeError: Expected to have finished reduction" and crashed.alarm
    finished = rank_row(beat(state="finished"), NOW)
    assert finished.doing == "finished" and not finished.alarm
    gloo = ("RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:59106: Connection reset by peer. This is typically caused by a remote worker hanging")
    long = rank_row(beat(state="crashed", detail=gloo), NOW).doing
    assert long.startswith("crashed: RuntimeError: [/__w/pytorch") and long.endswith(" …") and len(long) < 110


def test_a_rank_killed_by_a_signal_names_it():
    row = rank_row(beat(state="computing", t=NOW - 4), NOW, exitcode=-9)
    assert row.doing == "killed by SIGKILL" and row.alarm
    assert exit_text(-6) == "killed by SIGABRT" and exit_text(3) == "exited with code 3"


def test_a_frozen_rank_shows_its_silent_heartbeat():
    row = rank_row(beat(state="computing", t=NOW - 7), NOW)
    assert row.doing == "computing; no heartbeat for 7.0 s" and row.alarm


def test_the_epoch_follows_loader_passes_without_set_epoch():
    assert rank_row(beat(epoch=None, passes=2), NOW).epoch == "2"
    assert rank_row(beat(epoch=5, passes=2), NOW).epoch == "5"  # set_epoch wins
    assert rank_row(beat(epoch=None, passes=0, steps=0), NOW).epoch == ""


def test_steps_are_the_ranks_own_counts():
    rows = [rank_row(beat(r, steps=128), NOW) for r in (0, 1)]
    assert [r.step for r in rows] == ["128", "128"]


def test_start_up_phases_with_a_timer():
    assert header({}, 3.04) == "ddpdoctor: starting · 3.0 s · launching torchrun agents and rendezvous"
    importing = {0: beat(0, state="importing", steps=0)}
    assert header(importing, 4.5) == \
        "ddpdoctor: starting 2 ranks · 4.5 s · importing torch on 1 of 2 ranks, 1 not started yet"
    started = {r: beat(r, state="computing", steps=0) for r in (0, 1)}
    assert header(started, 6.0) == "ddpdoctor: 2 ranks · 6.0 s · script started, no optimizer step yet"


def test_the_stall_counter_against_the_hang_threshold_and_the_last_collective():
    beats = {r: beat(r, state="waiting", last_collective={"op": "barrier", "n": 85 - r}) for r in (0, 1)}
    assert header(beats, 42.0, stall_s=12.2, threshold_s=30.0) == \
        "ddpdoctor: 2 ranks · 42 s · no progress 12 s / hang at 30 s · last collective #85"
    assert "no progress" not in header(beats, 42.0, stall_s=2.9, threshold_s=30.0)  # a quiet moment, not a stall


def test_durations_read_like_a_timer():
    assert ([duration(s) for s in (0.04, 9.96, 12.4, 65, 3725)]
            == ["0.0 s", "10.0 s", "12 s", "1 min 05 s", "1 h 02 min"])
