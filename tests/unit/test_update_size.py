"""The rank measures an optimizer step's update against the weights' precision, so optimizer-params
can tell a weight that cannot move (a bias before BatchNorm, bfloat16 LayerNorm scales) from one
that should have."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpdoctor.rank.update_size import examine, spacing


def test_spacing_is_the_distance_to_the_next_representable_value():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        values = torch.tensor([1.0, -3.0, 0.001, 1000.0], dtype=dtype)
        expected = (torch.nextafter(values.abs().float(), torch.tensor(math.inf)) - values.abs().float()) \
            if dtype == torch.float32 else None
        got = spacing(values)
        if expected is not None:
            assert torch.equal(got, expected)
        assert got[0].item() == torch.finfo(dtype).eps
    assert spacing(torch.zeros(1)).item() > 0


def _conv_bn_step(optimizer_type, **kwargs):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    net(torch.randn(4, 3, 8, 8))
    optimizer = optimizer_type(net.parameters(), **kwargs)
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(net(torch.randn(16, 3, 8, 8)), torch.randint(0, 4, (16,))).backward()
        optimizer.step()
    return net, optimizer


def test_a_conv_bias_before_batchnorm_has_a_negligible_gradient():
    net, optimizer = _conv_bn_step(torch.optim.SGD, lr=0.05, momentum=0.9)
    measured, median = examine(optimizer, [1])  # the conv's bias
    rms, ratio = measured["1"]
    assert rms < 1e-5 * median  # zero but for rounding, next to the other gradients
    assert ratio is not None


def test_bfloat16_layernorm_scales_under_adamw_lose_their_updates():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4)
    for _ in range(3):
        optimizer.zero_grad()
        net(torch.randn(8, 16, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()
    scale = 2  # Linear weight, Linear bias, then the LayerNorm's weight
    assert torch.all(net[1].weight == 1)  # still exactly its initial value
    measured, median = examine(optimizer, [scale])
    rms, ratio = measured[str(scale)]
    assert rms > 1e-3 * median  # a real gradient
    assert ratio < 1  # 3e-4 against bfloat16's 2**-7 at 1.0


def test_a_real_update_is_many_times_the_spacing():
    net, optimizer = _conv_bn_step(torch.optim.Adam, lr=1e-3)
    measured, _ = examine(optimizer, [0])  # the conv's weight
    assert measured["0"][1] > 100


def test_an_optimizer_whose_rule_is_unknown_gives_no_ratio():
    net, optimizer = _conv_bn_step(torch.optim.Adagrad, lr=0.01)
    measured, median = examine(optimizer, [0])
    assert measured["0"][1] is None and measured["0"][0] > 0 and median > 0
