"""FSDP's collectives in the per-rank trace: its all-gathers and reduce-scatters, traced like the
script's own calls, carry their FSDP phase and the user's line (issue #32, item 3)."""

from __future__ import annotations

import sys

import torch
from builders import SCRIPT, collective, frame, init_pg, make_evidence, merge, on_all, stop_snapshot

from ddpdoctor.analysis.api import Location
from ddpdoctor.analysis.collective_trace import TraceEntry
from ddpdoctor.checks.collective_hang import analyze
from ddpdoctor.rank.probes.collectives import fsdp_phase
from ddpdoctor.schema.events import DDP_PHASE_WORDS, Collective, InternalPhase


def fsdp(event: Collective, phase: str = "fsdp-forward") -> Collective:
    event.phase = phase
    return event


def step(first: int, *, group=None, line: int = 30) -> list[Collective]:
    """One FSDP training step of two sharded layers: all-gathers in the forward, all-gathers and
    reduce-scatters in the backward, numbered from ``first``."""
    return [fsdp(collective("all_gather_single", first, (8,), line=line, group=group)),
            fsdp(collective("all_gather_single", first + 1, (8,), line=line, group=group)),
            fsdp(collective("all_gather_single", first + 2, (8,), line=line + 1, group=group), "fsdp-backward"),
            fsdp(collective("reduce_scatter_single", first + 3, (4,), line=line + 1, group=group), "fsdp-backward")]


def traced(world_size, traces, **observations):
    return make_evidence(world_size, merge(on_all(world_size, init_pg(world_size)), traces), **observations)


def test_fsdp_collectives_on_the_world_group_are_matched_and_counted():
    trace = step(1) + step(5)
    result = analyze(traced(2, {0: trace, 1: trace}))
    assert result.findings == []
    assert result.summary == "16 collectives matched across ranks (16 of them FSDP's)"


def test_fsdp_collectives_on_a_mesh_group_of_their_own_are_counted():
    """A gloo job beside GPUs (or under device simulation) gets a DeviceMesh group of its own."""
    trace = step(1, group=[0, 1]) + [collective("all_reduce", 1, (1,), line=40)]
    result = analyze(traced(2, {0: trace, 1: trace}))
    assert result.findings == []
    assert result.summary == "10 collectives matched across ranks (8 of them FSDP's)"


def test_scripts_without_fsdp_keep_their_summary():
    trace = [collective("all_reduce", 1), collective("all_reduce", 2, group=[0, 1])]
    assert analyze(traced(2, {0: trace, 1: trace})).summary == "2 collectives matched across ranks"


def test_an_fsdp_all_gather_paired_with_another_collective_is_named_with_its_phase_and_line():
    """Rank 0 trains one batch more: its next forward's all-gather meets rank 1's barrier."""
    result = analyze(traced(2, {
        0: step(1) + step(5, line=30)[:1],
        1: step(1) + [collective("barrier", 5, shape=None, line=33)],
    }))
    (finding,) = result.findings
    assert finding.message == (
        "collective #5 differs across ranks: rank 0 called all_gather_single of float32[8] in FSDP's forward "
        "at train.py:30, rank 1 called barrier at train.py:33")
    assert finding.location == Location(SCRIPT, 33)  # as for DDP: the line only some ranks ran comes first
    assert finding.evidence["culprit_phase"] == "call"  # rank 1's barrier
    assert finding.evidence["calls"]["0"]["phase"] == "fsdp-forward"


def test_a_hang_in_fsdps_all_gather_on_its_mesh_group_names_it_as_the_ranks_last_collective():
    """Uneven inputs under FSDP on a mesh group of its own: rank 0 waits in its extra batch's
    all-gather, rank 1 in the barrier after its loop."""
    hang = stop_snapshot(
        {0: {"activity": "in all_gather_single #9 in FSDP's forward"}, 1: {"activity": "in barrier #1"}},
        {0: [frame(30, user=True), frame(3000, user=False, function="all_gather_single")],
         1: [frame(33, user=True), frame(3000, user=False, function="barrier")]})
    result = analyze(traced(2, {
        0: step(1, group=[0, 1]) + step(5, group=[0, 1]) + step(9, group=[0, 1])[:1],
        1: step(1, group=[0, 1]) + step(5, group=[0, 1]) + [collective("barrier", 1, shape=None, line=33, t=20.0)],
    }, outcome="hung", stop=hang))
    (finding,) = result.findings
    assert finding.message.startswith(
        "the job hung: rank 0 waits in all_gather_single #9 in FSDP's forward at train.py:30 (main); rank 1 waits "
        "in barrier #1 at train.py:33 (main)")
    states = finding.evidence["ranks"]
    assert states["0"]["last_collective"] == {"op": "all_gather_single", "n": 9, "group": [0, 1],
                                              "site": {"file": SCRIPT, "line": 30, "function": "main"}}
    assert states["1"]["last_collective"]["op"] == "barrier"  # after its last FSDP call


def test_an_fsdp_call_is_described_with_what_it_is_part_of():
    entry = TraceEntry(3, fsdp(collective("reduce_scatter_single", 3, (4,)), "fsdp-backward"), "reduce_scatter_single")
    assert entry.phase == "fsdp-backward"
    assert entry.describe() == "reduce_scatter_single of float32[4] in FSDP's backward"
    assert TraceEntry(1, collective("all_reduce", 1), "all_reduce").phase == "call"


def test_fsdp_phases_are_not_ddps():
    assert not InternalPhase.FSDP_FORWARD.is_ddp and not InternalPhase.FSDP_BACKWARD.is_ddp
    assert InternalPhase.DDP_BACKWARD.is_ddp
    assert set(DDP_PHASE_WORDS) == {"ddp-init", "ddp-forward", "ddp-backward"}
    assert InternalPhase.FSDP_FORWARD.words == "FSDP's forward all-gather"


def test_fsdp_collectives_omit_no_phase_from_their_json():
    assert "phase" not in collective("all_reduce", 1).to_json()
    assert fsdp(collective("all_gather_single", 1)).to_json()["phase"] == "fsdp-forward"


# -- the rank side: which calls are FSDP's ------------------------------------------------------------

# A caller whose code lives where FSDP's does, as FSDP's hooks call dist.all_gather_single.
_FAKE_FSDP = compile("def call(probe):\n    return probe(sys._getframe(0))\n",
                     "/venv/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "exec")
_namespace: dict = {"sys": sys}
exec(_FAKE_FSDP, _namespace)


def test_a_call_from_fsdps_code_is_fsdps_forward_outside_a_backward():
    assert _namespace["call"](fsdp_phase) == "fsdp-forward"
    assert fsdp_phase(sys._getframe(0)) is None  # the script's own call


def test_a_call_from_fsdps_code_inside_a_backward_is_fsdps_backward():
    seen = []

    class Hooked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(_namespace["call"](fsdp_phase))
            return grad * 2

    Hooked.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == ["fsdp-backward"]
