"""Device values reaching the host later (rank/host_copies.py): consumers run in the order they
were queued, a host that runs too far ahead waits for the oldest, a flush never waits forever, and
the optimizer and loss probes write the same evidence, in the same order, whether their values
come at once or steps later. The deferred path is exercised with CPU tensors (``defer_cpu``) and
with stand-in events whose completion the test decides."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F

from ddpdoctor.rank import host_copies
from ddpdoctor.rank.host_copies import HostCopies
from ddpdoctor.rank.probes import loss as loss_probe
from ddpdoctor.rank.probes import optimizer as optimizer_probe
from ddpdoctor.rank.probes import patching
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import RankSettings
from one_rank import run_one_rank


class _Event:
    """A stand-in CUDA event: complete when the test says so, or when waited for; ``broken``: the
    device failed (a CUDA error raises from every later query)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = False
        self.broken = False

    def query(self) -> bool:
        if self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.done

    def synchronize(self) -> None:
        self.waited = True
        self.done = True


def _queue_pending(copies: HostCopies, value: int, seen: list, *, done: bool = False, broken: bool = False) -> _Event:
    event = _Event()
    event.done, event.broken = done, broken
    copies._queue.append(host_copies._Entry([torch.tensor([value])], event, lambda host: seen.append(host)))
    return event


def test_cpu_values_are_handed_over_at_once_when_nothing_waits():
    seen: list = []
    copies = HostCopies(on_error=pytest.fail)
    copies.later([torch.tensor([1, 2]), torch.tensor([3.5])], seen.append)
    assert seen == [[[1, 2], [3.5]]] and len(copies) == 0


def test_a_value_ready_at_once_waits_behind_earlier_ones_so_the_order_is_kept():
    seen: list = []
    copies = HostCopies(on_error=pytest.fail)
    event = _queue_pending(copies, 7, seen)
    copies.later([torch.tensor([8])], seen.append)  # a CPU value, behind the pending one
    copies.later([], lambda host: seen.append("no values"))
    assert seen == [] and len(copies) == 3
    event.done = True
    copies.poll()
    assert seen == [[[7]], [[8]], "no values"] and not event.waited


def test_a_host_too_far_ahead_waits_for_the_oldest_only():
    seen: list = []
    copies = HostCopies(on_error=pytest.fail)
    events = [_queue_pending(copies, i, seen) for i in range(host_copies.MAX_BEHIND + 2)]
    copies.poll()
    assert [e.waited for e in events] == [True, True] + [False] * host_copies.MAX_BEHIND
    assert seen == [[[0]], [[1]]] and len(copies) == host_copies.MAX_BEHIND


def test_a_flush_hands_over_none_for_what_the_device_never_delivers():
    seen: list = []
    copies = HostCopies(on_error=pytest.fail)
    _queue_pending(copies, 1, seen, done=True)
    stuck = _queue_pending(copies, 2, seen)
    copies.flush(wait_s=0.05)
    assert seen == [[[1]], None] and not stuck.waited and len(copies) == 0


def test_a_failed_device_hands_over_none_once_and_the_queue_moves_on():
    seen: list = []
    copies = HostCopies(on_error=pytest.fail)
    _queue_pending(copies, 1, seen, broken=True)
    _queue_pending(copies, 2, seen, done=True)
    copies.poll()
    assert seen == [None, [[2]]] and len(copies) == 0


def test_a_failing_consumer_is_reported_and_the_next_ones_still_run():
    errors: list = []
    seen: list = []
    copies = HostCopies(on_error=errors.append, defer_cpu=True)
    copies.later([torch.tensor([1])], lambda host: 1 / 0)
    copies.later([torch.tensor([2])], seen.append)
    copies.flush()
    assert [type(e) for e in errors] == [ZeroDivisionError] and seen == [[[2]]]


def _train_under_probes(tmp_path, *, deferred: bool, device: str = "cpu") -> list[dict]:
    """Six AdamW steps of a small model, every step fingerprinted and its losses weighed, under the
    optimizer and loss probes; the events written, without their wall-clock times. On a GPU the
    values are always deferred (``deferred`` then only says whether the CPU's are)."""
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path), fingerprint_every=1))
    rec.host_copies = HostCopies(on_error=pytest.fail, defer_cpu=deferred)
    finishes = [loss_probe.install(rec), optimizer_probe.install(rec)]
    loss_probe._WINDOW = loss_probe._Window(sampled=True)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        for step in range(6):
            inputs, target = torch.randn(16, 6).to(device), torch.randint(0, 3, (16,))
            target[: step % 3] = -100
            target = target.to(device)
            F.cross_entropy(model(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            if deferred and device == "cpu":
                assert len(rec.host_copies) > 0  # the values are still on their way
        rec.host_copies.flush()
    finally:
        for finish in finishes:
            finish()
        patching.restore_all()
        rec.close()
    (name,) = [n for n in os.listdir(tmp_path) if n.startswith("events")]
    events = [json.loads(line) for line in open(tmp_path / name)]
    return [{k: v for k, v in e.items() if k not in ("t", "timing")} for e in events]


def test_deferred_values_write_the_same_evidence_in_the_same_order(tmp_path):
    at_once, later = [_train_under_probes(tmp_path / str(d), deferred=d) for d in (False, True)]  # one call site
    steps = [e for e in later if e["kind"] == "step"]
    assert [e["n"] for e in steps] == [1, 2, 3, 4, 5, 6] and all(e["grads"] and e["params"] for e in steps)
    windows = [e for e in later if e["kind"] == "loss_window"]
    assert [c["count"] for w in windows for c in w["calls"]] == [16, 15, 14, 16, 15, 14]
    assert later == at_once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (bench/gpu_session.sh runs it on one)")
def test_on_a_gpu_the_values_come_behind_a_cuda_event_and_match_the_cpus(tmp_path):
    """The same training on the GPU: its values wait behind CUDA events, yet each step's and each
    window's evidence is there, in order, with the loss counts the CPU gives (fingerprints differ:
    the GPU's arithmetic is not the CPU's)."""
    cpu, gpu = [_train_under_probes(tmp_path / d, deferred=False, device=d) for d in ("cpu", "cuda")]
    def shape(events: list[dict]) -> list:
        return [(e["kind"], e.get("n"), e.get("step"), bool(e.get("grads")), bool(e.get("params")),
                 [c["count"] for c in e.get("calls", [])]) for e in events]
    assert shape(gpu) == shape(cpu)


_DDP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.host_copies import HostCopies
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    rec = Recorder(RankSettings(evidence_dir=os.environ["EVIDENCE"], fingerprint_every=1, device="native"))
    rec.host_copies = HostCopies(on_error=print, defer_cpu=sys.argv[1] == "later")
    finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
    for epoch in range(2):
        for x, y in DataLoader(data, batch_size=16, shuffle=True):
            loss = torch.nn.functional.cross_entropy(model(x.clone()), y)  # a copy: hashed at the forward
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if sys.argv[1] == "later":
                assert len(rec.host_copies) > 0
    rec.host_copies.flush()
    finish()
    dist.destroy_process_group()
    rec.close()
""")


def _run_ddp(tmp_path, mode: str) -> dict[str, list[dict]]:
    """The script above under every probe, its values handed over at once or later: its events by
    kind, in order, without what differs from run to run (wall times, the environment)."""
    _, events = run_one_rank(_DDP_SCRIPT, mode, evidence=tmp_path / mode)
    kinds: dict[str, list[dict]] = {}
    for event in events:
        # a content window closes when the next forward's rows arrive: later, by the collectives in between
        varying = {"t", "timing", "pid", *(("seq",) if event["kind"] == "content_pass" else ())}
        kinds.setdefault(event["kind"], []).append({k: v for k, v in event.items() if k not in varying})
    return kinds


def test_every_probe_writes_the_same_evidence_when_values_come_later(tmp_path):
    """DDP, a shuffled DataLoader, a copy of each batch fed to the model (its rows hashed at the
    forward), every step fingerprinted: the steps, loss windows and content windows are the same, in
    the same order, whether the values arrive at once or a step later (interleaved differently with
    events of other kinds, which are written as they happen)."""
    at_once, later = _run_ddp(tmp_path, "at_once"), _run_ddp(tmp_path, "later")
    assert len(later["step"]) == 12 and "probe_error" not in later
    assert [e["step"] for e in later["loss_window"]] == list(range(1, 11))  # the automatic schedule's (explains)
    assert {e.get("source") for e in later["content_pass"]} == {"loader", "forward"}
    assert later == at_once
