"""The loss probe in one process, on real autograd graphs: the counts of contributing targets, the
scalar factors between backward's root and each loss (divisions, accumulation, means of stacked
losses, GradScaler's scale divided out), mean-type nodes reached without a probed call, and the
line that names the world size. Installed through its real entry point and undone after."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch
import torch.nn.functional as F

from ddpdoctor.rank.probes import loss as loss_probe
from ddpdoctor.rank.probes import patching
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import RankSettings


@pytest.fixture
def probe(tmp_path):
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = loss_probe.install(rec)

    def windows() -> list[dict]:
        rec.close()
        (name,) = [n for n in os.listdir(tmp_path) if n.startswith("events")]
        return [e for e in map(json.loads, open(tmp_path / name)) if e["kind"] == "loss_window"]

    try:
        yield rec, windows
    finally:
        finish()
        patching.restore_all()


def _batch(ignored: int, n: int = 8, classes: int = 5):
    logits = torch.randn(n, classes, requires_grad=True)
    target = torch.randint(0, classes, (n,))
    target[:ignored] = -100
    return logits, target


def test_a_mean_cross_entropy_is_counted_and_reached_with_factor_one(probe):
    rec, windows = probe
    logits, target = _batch(ignored=3)
    F.cross_entropy(logits, target).backward()
    loss_probe.close_window(rec, 1, next_sampled=True)
    (window,) = windows()
    (call,) = window["calls"]
    assert (call["fn"], call["reduction"], call["count"], call["numel"], call["factor"]) == \
        ("cross_entropy", "mean", 5, 8, 1.0)
    assert window["backwards"] == 1 and call["site"][0]["file"] == __file__


def test_accumulation_and_divisions_multiply_into_each_micro_batchs_factor(probe):
    rec, windows = probe
    world_size = 2
    for ignored in (0, 4):
        logits, target = _batch(ignored)
        (torch.nn.CrossEntropyLoss()(logits, target) / 4).backward()
    logits, target = _batch(0)
    loss = F.nll_loss(F.log_softmax(logits, -1), target)
    loss = loss / world_size
    loss.backward()
    loss_probe.close_window(rec, 1, next_sampled=False)
    (window,) = windows()
    assert [(c["fn"], c["count"], c["factor"]) for c in window["calls"]] == \
        [("cross_entropy", 8, 0.25), ("cross_entropy", 4, 0.25), ("nll_loss", 8, 0.5)]
    assert window["scaling_at"][0]["line"] > window["calls"][-1]["site"][0]["line"]  # `loss / world_size`


def test_stacked_means_sums_and_the_global_count(probe):
    rec, windows = probe
    a, b = _batch(0), _batch(0)
    torch.stack([F.cross_entropy(*a), F.cross_entropy(*b)]).mean().backward()
    logits, target = _batch(2)
    tokens = (target != -100).sum() * 3  # as if all-reduced over three ranks
    (F.cross_entropy(logits, target, reduction="sum") / tokens * 3).backward()
    loss_probe.close_window(rec, 1, next_sampled=False)
    (window,) = windows()
    factors = [c["factor"] for c in window["calls"]]
    assert factors[:2] == [0.5, 0.5]
    assert factors[2] == pytest.approx(3 / 18)
    assert window["calls"][2]["reduction"] == "sum"


def test_a_masked_mean_weighs_each_kept_element_and_other_means_are_recorded(probe):
    rec, windows = probe
    logits, target = _batch(0)
    per_token = F.cross_entropy(logits, target, reduction="none")
    mask = (torch.arange(8) < 5).float()
    ((per_token * mask).sum() / mask.sum()).backward()
    prediction = torch.randn(4, 3, requires_grad=True)
    (0.5 * F.mse_loss(prediction, torch.zeros(4, 3)) + prediction.pow(2).mean()).backward()
    weights = torch.linspace(0.5, 1.5, 8)  # a weighting, not a mask: not judged
    (F.cross_entropy(logits, target, reduction="none") * weights).mean().backward()
    loss_probe.close_window(rec, 1, next_sampled=False)
    (window,) = windows()
    masked, weighted = window["calls"]
    assert (masked["elementwise"], masked["factor"], masked["reduction"]) == (False, 0.2, "none")  # 1/mask.sum()
    assert weighted["elementwise"] is True
    assert sorted((m["node"], m["factor"]) for m in window["means"]) == [("mean", 1.0), ("mse_loss", 0.5)]


def test_the_grad_scalers_scale_is_no_weighting(probe):
    rec, windows = probe
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    logits, target = _batch(0)
    scaler.scale(F.cross_entropy(logits, target)).backward()
    loss_probe.close_window(rec, 1, next_sampled=False)
    (window,) = windows()
    assert window["calls"][0]["factor"] == 1.0 and window["scaled"] is True


def test_unsampled_windows_and_calls_without_gradients_cost_nothing(probe):
    rec, windows = probe
    loss_probe.close_window(rec, 1, next_sampled=False)  # step 2 is not fingerprinted
    logits, target = _batch(0)
    F.cross_entropy(logits, target).backward()
    loss_probe.close_window(rec, 2, next_sampled=True)
    with torch.no_grad():
        F.cross_entropy(logits, target)  # an evaluation
    loss_probe.close_window(rec, 3, next_sampled=True)
    assert windows() == []


@contextlib.contextmanager
def _one_backward():
    """The current window with its gradient samples emptied and one backward counted, restored after."""
    window = loss_probe._WINDOW
    saved = (window.grads, window.backwards)
    window.grads, window.backwards = {}, 1
    try:
        yield window
    finally:
        window.grads, window.backwards = saved


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 7),  # contiguous
    lambda: torch.randn(7, 6).t(),  # transposed: its row-major coordinates are not its memory order
    lambda: torch.randn(2, 8, 3, 3).to(memory_format=torch.channels_last),
    lambda: torch.randn(40, dtype=torch.bfloat16),
    lambda: torch.randn(3),  # fewer coordinates than a sample takes
    lambda: torch.randn(0),
])
@pytest.mark.parametrize("take", [True, False], ids=["take", "other-backends"])
def test_a_local_gradient_sample_is_its_first_row_major_coordinates_widened_exactly(make, take, monkeypatch):
    if not take:
        monkeypatch.setattr(loss_probe, "_TAKE_DEVICES", ())
    grad = make()
    with _one_backward() as window:
        loss_probe.record_grad(0, 0, 1, grad)
        layout, (joined,) = loss_probe._grad_samples(window)
    k = min(loss_probe.MAX_PER_PARAMETER, grad.numel())
    assert layout == [[0, 0, k]]
    assert joined.dtype == torch.float64
    assert torch.equal(joined, grad.reshape(-1)[:k].to(torch.float64))


@pytest.mark.parametrize("dtypes", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),  # one dtype: joined, then widened once
    (torch.float32, torch.bfloat16, torch.float16),  # mixed: each part widened on its own
], ids=["one-dtype", "mixed"])
def test_a_backwards_samples_are_joined_in_key_order_widened_exactly(dtypes):
    grads = [torch.randn(50, dtype=dtype) * 1e3 for dtype in dtypes]
    with _one_backward() as window:
        for position in reversed(range(len(grads))):  # arrival order is the backward's, not the key order
            loss_probe.record_grad(0, position, len(grads), grads[position])
        layout, (joined,) = loss_probe._grad_samples(window)
    k = [entry[2] for entry in layout]
    assert [entry[:2] for entry in layout] == [[0, 0], [0, 1], [0, 2]]
    assert joined.dtype == torch.float64
    expected = torch.cat([g[:n].to(torch.float64) for g, n in zip(grads, k)])
    assert torch.equal(joined, expected)
