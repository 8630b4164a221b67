"""buffer-sync: buffers compared across ranks at each training forward."""

from __future__ import annotations

from builders import SCRIPT, buffers, ddp_wrap, fp, make_evidence, merge, on_all

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.buffer_sync import analyze

BUFFERS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


def evidence(per_rank_buffers, *, broadcast_buffers=True, world_size=2, names=BUFFERS):
    return make_evidence(world_size, merge(
        on_all(world_size, ddp_wrap(["bn.weight"], buffers=names, broadcast_buffers=broadcast_buffers)),
        per_rank_buffers))


def test_buffers_differing_without_broadcast_are_a_warning():
    result = analyze(evidence({
        0: [buffers(1, fp(0.0, 1.0, 0.0)), buffers(2, fp(0.1, 1.0, 1.0))],
        1: [buffers(1, fp(0.0, 1.0, 0.0)), buffers(2, fp(0.3, 1.0, 1.0))],
    }, broadcast_buffers=False))
    (finding,) = result.findings
    assert finding.check == "buffer-sync"
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 20)
    assert finding.message.startswith("buffer `bn.running_mean` differs across ranks from training forward 2 on")
    assert "broadcast_buffers=False" in finding.message
    assert finding.evidence["buffer"] == "bn.running_mean"
    assert finding.evidence["forward"] == 2
    assert finding.evidence["broadcast_buffers"] is False
    assert "SyncBatchNorm" in finding.fix
    assert result.status == "warn"


def test_buffers_differing_although_ddp_broadcasts_them_are_an_error():
    result = analyze(evidence({
        0: [buffers(1, fp(0.0, 1.0, 0.0))],
        1: [buffers(1, fp(0.0, 2.0, 0.0))],
    }))
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.evidence["buffer"] == "bn.running_var"
    assert "at training forward 1 although DDP broadcasts buffers" in finding.message
    assert result.status == "fail"


def test_the_earliest_forward_is_reported():
    result = analyze(evidence({
        0: [buffers(1, fp(0.0, 1.0, 0.0)), buffers(2, fp(0.0, 1.0, 0.0)), buffers(3, fp(5.0, 1.0, 0.0))],
        1: [buffers(1, fp(0.0, 1.0, 0.0)), buffers(2, fp(0.0, 1.0, 9.0)), buffers(3, fp(6.0, 1.0, 0.0))],
    }))
    (finding,) = result.findings
    assert finding.evidence["forward"] == 2
    assert finding.evidence["buffer"] == "bn.num_batches_tracked"


def test_identical_buffers_are_clean():
    same = [buffers(1, fp(0.0, 1.0, 0.0)), buffers(2, fp(0.5, 0.9, 1.0))]
    result = analyze(evidence({0: same, 1: same}, broadcast_buffers=False))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "buffers identical across ranks at 2 compared forwards"


def test_buffers_equal_within_tolerance_are_clean():
    result = analyze(evidence({
        0: [buffers(1, [[0.5, 1.0]])],
        1: [buffers(1, [[0.5 * (1 + 1e-9), 1.0]])],
    }, names=["bn.running_mean"]))
    assert result.status == "pass"


def test_no_buffers_in_the_ddp_module_is_skipped():
    result = analyze(make_evidence(2, [ddp_wrap(["fc.weight"])]))
    assert result.status == "skip"


def test_no_ddp_wrap_is_skipped():
    assert analyze(make_evidence(2, [])).status == "skip"


def test_single_process_is_skipped():
    result = analyze(evidence({0: [buffers(1, fp(0.0, 1.0, 0.0))]}, world_size=1))
    assert result.status == "skip"


def test_forwards_seen_on_one_rank_only_are_skipped():
    result = analyze(evidence({0: [buffers(1, fp(0.0, 1.0, 0.0))], 1: []}))
    assert result.status == "skip"
    assert result.summary == "no training forward seen on two ranks"
