"""Fingerprint cost in one process and one thread, no contention: the fused fingerprint of a
model's gradients and parameters against the work of a training step of that model."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from common import table


def _median_ms(fn: Callable[[], object], repeats: int = 30) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def bench_fingerprint() -> None:
    import torch

    from ddpdoctor.rank import fingerprint as fingerprints
    from ddpdoctor.schema.fingerprints import encode_fingerprints

    torch.set_num_threads(1)
    rows = []
    for width, depth in ((256, 4), (1024, 9)):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(32, width)

        def step(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer,
                 x: torch.Tensor = x) -> None:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

        def probe(model: torch.nn.Module = model) -> None:
            params = list(model.parameters())
            grads, values = fingerprints.resolve(fingerprints.start([p.grad for p in params]),
                                                 fingerprints.start(params))
            encode_fingerprints(grads), encode_fingerprints(values)

        step_ms, probe_ms = _median_ms(step), _median_ms(probe)
        params = sum(p.numel() for p in model.parameters())
        rows.append([f"MLP {depth}x{width} ({params / 1e6:.1f}M params)", f"{step_ms:.2f}", f"{probe_ms:.2f}",
                     f"{100 * probe_ms / step_ms:.1f}%"])
    table("fingerprint of gradients + parameters per fingerprinted step (1 thread, batch 32, SGD momentum)",
          ["model", "step ms", "fingerprint ms", "of a step"], rows)
