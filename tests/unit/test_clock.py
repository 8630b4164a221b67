"""The rank's collective clock: the backend's sequence numbers booked to traced calls and to what
DDP issued in between, with point-to-point traffic taken out of the numbering."""

from __future__ import annotations

from ddpdoctor.rank.clock import CollectiveClock, Phase, units_of


class Group:
    """A process group whose backend numbers its collectives, advanced by hand."""

    def __init__(self) -> None:
        self.seq = 0

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


class NoNumbers:
    def _get_sequence_number_for_group(self) -> int:
        raise RuntimeError("this backend does not number its collectives")


def clock():
    written = []
    return CollectiveClock(written.append), written


def test_what_ddp_issued_between_observations_is_booked_to_its_phase():
    c, written = clock()
    group = Group()
    c.attach(group)
    assert c.numbering == "pg"
    c.enter(Phase("ddp-init", site=[{"file": "train.py", "line": 10}]))
    group.seq += 4  # the constructor's broadcasts
    c.enter(Phase("ddp-forward", ddp=0, grad=True, site=[{"file": "train.py", "line": 20}]))
    group.seq += 2  # buffer broadcast
    c.enter(Phase())
    assert [(e.phase, e.first, e.count, e.site[0]["line"]) for e in written] == [("ddp-init", 1, 4, 10),
                                                                               ("ddp-forward", 5, 2, 20)]
    assert c.units == 6


def test_a_traced_call_takes_its_own_numbers_and_point_to_point_none():
    c, written = clock()
    group = Group()
    c.attach(group)
    group.seq += 1  # DDP's all-reduce in a backward, not yet booked
    c.phase = Phase("ddp-backward", site=[{"file": "train.py", "line": 30}])
    n, before = c.before_call("all_gather_object", 2)
    assert (n, before) == (2, 1) and written[-1].phase == "ddp-backward"
    assert c.units == 3  # counted before the call runs: a call that hangs is ordered already
    group.seq += 2
    c.after_call("all_gather_object", n, 2, before)
    n, before = c.before_call("send", 0)
    group.seq += 1  # gloo numbers sends too
    c.after_call("send", n, 0, before)
    assert c.units == 3
    n, before = c.before_call("all_reduce", 1)
    assert n == 4


def test_a_call_that_issued_more_than_predicted_is_numbered_by_what_it_issued():
    c, _ = clock()
    group = Group()
    c.attach(group)
    n, before = c.before_call("scatter_object_list", 2)
    group.seq += 3
    c.after_call("scatter_object_list", n, 2, before)
    assert c.units == 3


def test_a_backend_without_numbers_counts_calls():
    c, written = clock()
    c.attach(NoNumbers())
    assert c.numbering == "calls"
    n, before = c.before_call("barrier", 1)
    c.after_call("barrier", n, 1, before)
    c.sync()
    assert (n, c.units, written) == (1, 1, [])


def test_subgroups_are_numbered_by_their_own_calls():
    c, _ = clock()
    c.attach(Group())
    n1, before = c.before_call("all_reduce", 1, group=(0, 1))
    c.after_call("all_reduce", n1, 1, before, group=(0, 1))
    n2, _ = c.before_call("all_reduce", 1, group=(0, 1))
    assert (n1, n2, c.units) == (1, 2, 0)


def test_units_of_calls():
    assert units_of("send", 1) == 0 and units_of("monitored_barrier", 6) == 1 and units_of("all_reduce", 1) == 1
    assert units_of("new_group", 0) == 0
