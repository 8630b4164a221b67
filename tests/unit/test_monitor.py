"""The monitor's hang policy on a scripted job: a hang is declared only from two looks that agree."""

from __future__ import annotations

import os
import time
from typing import Optional

from ddpdoctor.schema.observations import Heartbeat, StackDump
from ddpdoctor.supervisor.display import NullDisplay
from ddpdoctor.supervisor.job_output import OutputRouter
from ddpdoctor.supervisor.monitor import Monitor

TORCH = "/venv/lib/python3.11/site-packages/torch"
USER = {"file": "/job/train.py", "line": 7, "function": "main", "code": "", "user": True}
BARRIER = [USER, {"file": f"{TORCH}/distributed/distributed_c10d.py", "line": 1, "function": "barrier",
                  "code": "", "user": False}]
LOADING = [USER, {"file": f"{TORCH}/utils/data/dataloader.py", "line": 1, "function": "__next__",
                  "code": "", "user": False}]
# a rank past the script, joining a thread at exit
JOINING = [{"file": "/usr/lib/python3.11/threading.py", "line": 1, "function": "_wait_for_tstate_lock", "code": "",
            "user": False}]


class ScriptedTransport:
    """Two live ranks that never progress; each stack request answers with the next scripted looks."""

    def __init__(self, looks: list[dict[int, list[dict]]]) -> None:
        self.looks = looks
        self.requests = 0

    def heartbeats(self) -> dict[int, Heartbeat]:
        return {r: Heartbeat(pid=os.getpid(), rank=r, world_size=2, t=time.time(), progress=5) for r in (0, 1)}

    def alive(self, beat: Heartbeat) -> bool:
        return True

    def request_stacks(self, ranks: dict[int, Heartbeat], wait_s: float = 0.0) -> dict[int, StackDump]:
        look = self.looks[min(self.requests, len(self.looks) - 1)]
        self.requests += 1
        return {r: StackDump(token="t", heartbeat=beat, stack=look[r]) for r, beat in ranks.items()}


class Job:
    def __init__(self, runs_for_s: float) -> None:
        self.ends = time.monotonic() + runs_for_s

    def finished(self) -> bool:
        return time.monotonic() > self.ends

    def drain(self) -> list[tuple[int, str]]:
        return []

    def track(self) -> None:
        pass


class Sink:
    def output(self, rank: Optional[int], line: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


def _watch(looks: list[dict[int, list[dict]]], runs_for_s: float, hang_timeout_s: float = 0.2) -> tuple:
    transport = ScriptedTransport(looks)
    monitor = Monitor(transport=transport, display=NullDisplay(), router=OutputRouter(Sink(), nproc_per_node=2),
                      hang_timeout_s=hang_timeout_s, timeout_s=None, world_size=2)
    return monitor.watch(Job(runs_for_s)), transport


def test_every_rank_waiting_in_the_same_place_twice_is_a_hang():
    result, transport = _watch([{0: BARRIER, 1: BARRIER}], runs_for_s=30)
    assert result.stop is not None and result.stop.reason == "hang"
    assert transport.requests == 2
    assert result.stop.ranks[1].waiting_in == "a torch.distributed call (barrier)"


def test_one_look_that_caught_a_rank_passing_through_a_collective_is_not_a_hang():
    """The second look finds rank 1 elsewhere: the first caught it arriving, so the job is not stopped."""
    result, transport = _watch([{0: BARRIER, 1: BARRIER}, {0: BARRIER, 1: LOADING}], runs_for_s=2.5)
    assert result.stop is None
    assert transport.requests >= 2


def test_a_stall_keeps_its_first_look_and_how_long_it_lasted():
    """Where the ranks were is the first look's (the one the live notice announced): a later look can
    catch them already past the stall, joining threads at exit, before a heartbeat shows their
    progress. Its length is the last age seen, not the first look's (about the threshold): of two
    stalls, the report names the longest, which the first looks' ages could not tell apart."""
    started = time.time()
    result, transport = _watch([{0: LOADING, 1: BARRIER}, {0: JOINING, 1: JOINING}], runs_for_s=3.2,
                               hang_timeout_s=0.5)
    assert result.stop is None
    assert transport.requests == 2  # busy ranks are looked at again every max(2 s, threshold / 2)
    (stall,) = result.stalls
    assert stall.ranks[0].state == "busy" and stall.ranks[0].waiting_in.startswith("the DataLoader")
    assert min(state.stalled_s for state in stall.ranks.values()) > 2.5
    assert stall.t - started > 2.5  # measured at its end: the timeline draws [t - age, t]
