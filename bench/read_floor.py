"""The floor under a fingerprinted step on a CPU (issue #34): what one read of the gradients and one of the
parameters cost where the probes read them, in the user-overhead job's loop.

    python bench/read_floor.py [--steps 80]

One process (1 gloo rank, DDP, one thread), the 9.5M-parameter MLP of bench/workloads/mlp_step.py with AdamW,
batch 64, no probes. After each backward (where the pre-step hook reads the gradients) and after each optimizer
step (where the post-step hook reads the parameters), in turn:
- the bare int64 sums of every tensor's words, nothing else (the least any exact read of every byte costs);
- ``ddpdoctor.rank.fingerprint`` of the same tensors, launched and resolved (the gradients with their sample);
- the bare sums once more, right after: the same bytes read from the caches the first read filled.
The first read of each kind alternates between the bare sums and the fingerprint, step by step, so that each is
measured first as often. Medians from step 6 (ms). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from common import overhead_mlp
from ddpdoctor.rank import fingerprint


def _ms(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def _bare_sums(tensors: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: [t.detach().reshape(-1).view(torch.int64).sum() for t in tensors]


def _fingerprint(tensors: list[torch.Tensor], **options: bool) -> Callable[[], object]:
    return lambda: fingerprint.resolve(fingerprint.start(tensors, **options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(store, 'store')}", rank=0, world_size=1)
        model = DistributedDataParallel(overhead_mlp())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        params = list(model.parameters())
        x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
        times: dict[str, list[float]] = {}

        def read_in_turn(what: str, tensors: list[torch.Tensor], probe: Callable[[], object], step: int) -> None:
            """The bare sums and the fingerprint, first in turn, then the bare sums again (booked from step 6)."""
            reads = [("bare", _bare_sums(tensors)), ("fingerprint", probe)]
            first, second = reads if step % 2 else reads[::-1]
            measured = [(f"{what}, {first[0]} first", _ms(first[1]))]
            measured.append((f"{what}, {second[0]} second", _ms(second[1])))
            measured.append((f"{what}, bare again", _ms(_bare_sums(tensors))))
            for key, ms in measured if step >= 5 else []:
                times.setdefault(key, []).append(ms)

        for step in range(args.steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            grads = [p.grad for p in params]
            read_in_turn("gradients", grads, _fingerprint(grads, also_sampled=True), step)
            optimizer.step()
            read_in_turn("parameters", params, _fingerprint(params), step)
        dist.destroy_process_group()
    megabytes = sum(p.nbytes for p in params) / 1e6
    print(f"{megabytes:.1f} MB of parameters, as many of gradients; median ms from step 6 (min)")
    for key in sorted(times):
        values = times[key]
        print(f"  {key:32s} {statistics.median(values):7.3f} ({min(values):.3f})  "
              f"{megabytes / statistics.median(values):5.1f} GB/s")


if __name__ == "__main__":
    main()
