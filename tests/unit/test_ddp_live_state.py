"""The DDP probe tells the live view when a backward has only DDP's gradient all-reduce left: every
parameter that got a gradient last iteration has one again, in a synchronized backward (under
no_sync there is no all-reduce to wait for). It also times the backward for the trace."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from ddpdoctor.rank.probes.ddp import DDPState, _grad_arrived  # noqa: E402
from ddpdoctor.rank.recorder import Recorder  # noqa: E402
from ddpdoctor.schema.settings import RankSettings  # noqa: E402


@pytest.fixture
def rec(tmp_path):
    recorder = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    yield recorder
    recorder.close()


def backward(rec, state, indices, *, synced: bool) -> None:
    rec.gradients_complete, state.arrived, state.iteration_open = False, 0, synced  # what a forward resets
    for i in indices:
        _grad_arrived(rec, state, i, None)


def test_a_synchronized_backward_waits_for_ddp_once_every_gradient_arrived(rec):
    state = DDPState(index=0, names=["a", "b", "c"], buffer_names=[], buffers=[])
    rec.gradients_complete, state.arrived, state.iteration_open = False, 0, True
    _grad_arrived(rec, state, 0, None)
    _grad_arrived(rec, state, 1, None)
    assert rec.gradients_complete is False and rec.timing.backward is not None and rec.timing.backward_end is None
    _grad_arrived(rec, state, 2, None)
    assert rec.gradients_complete is True and rec.timing.backward_end >= rec.timing.backward


def test_under_no_sync_a_backward_never_waits_for_ddp(rec):
    state = DDPState(index=0, names=["a", "b"], buffer_names=[], buffers=[])
    backward(rec, state, [0, 1], synced=False)
    assert rec.gradients_complete is False


def test_parameters_unused_last_iteration_are_not_waited_for(rec):
    state = DDPState(index=0, names=["a", "b", "aux"], buffer_names=[], buffers=[], expected_grads=2)
    backward(rec, state, [0, 1], synced=True)
    assert rec.gradients_complete is True


class _NumberedGroup:
    seq = 0

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


def test_the_heartbeat_numbers_ddps_own_collectives_after_the_last_traced_call(rec):
    """A rank blocked in DDP's gradient all-reduce shows that all-reduce as its last collective."""
    from ddpdoctor.rank.clock import Phase

    group = _NumberedGroup()
    rec.clock.attach(group)
    group.seq = 7
    rec.last_collective = {"op": "barrier", "n": 7, "site": None}
    assert rec.heartbeat().last_collective == {"op": "barrier", "n": 7, "site": None}
    rec.clock.enter(Phase("ddp-backward", ddp=0, grad=True))
    group.seq = 8  # the bucket all-reduce DDP enqueued from C++: no traced call saw it
    assert rec.heartbeat().last_collective == {"op": "DDP's gradient all-reduce", "n": 8, "site": None}
