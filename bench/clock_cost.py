"""What the collective clock costs (issue #16.1): one C++ getter of the process group's sequence
number per observation, and an event written when DDP issued collectives since the last one.

One process, a gloo group of one rank, a small DDP model: the time of `clock.enter()` (an
observation with nothing to book, then with a gap of collectives to book), against a training step
of the model measured the same way. Prints a table, asserts nothing.

    python bench/clock_cost.py [--repeats 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table  # noqa: E402

from ddpdoctor.rank.clock import CollectiveClock, Phase  # noqa: E402


def per_call_us(fn, repeats: int) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        samples.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        written: list = []
        clock = CollectiveClock(written.append)
        clock.attach(dist.group.WORLD)
        assert clock.numbering == "pg", "the backend must number its collectives for this bench"
        phase = Phase("ddp-forward", ddp=0, grad=True, training=True, site=[])
        idle_us = per_call_us(lambda: clock.enter(phase), args.repeats)
        flag = torch.zeros(1)

        def with_gap() -> None:
            dist.all_reduce(flag)  # the backend numbers it; the clock books it as DDP's
            clock.enter(phase)

        gap_us = per_call_us(with_gap, max(1, args.repeats // 20)) - per_call_us(lambda: dist.all_reduce(flag),
                                                                                 max(1, args.repeats // 20))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

        step_us = per_call_us(step, max(1, args.repeats // 100))
        dist.destroy_process_group()
    # Per training step the probes observe about four times: forward pre and post, the first
    # gradient hook, the optimizer's pre-hook; one of them books the step's all-reduces.
    per_step = 3 * idle_us + max(gap_us, idle_us)
    table("collective clock, one gloo rank, 1 thread", ["measure", "us"],
          [["observation, nothing to book (clock.enter)", f"{idle_us:.2f}"],
           ["observation that books collectives (one InternalCollectives event, in memory)", f"{gap_us:.2f}"],
           ["per step: 3 observations + 1 booking", f"{per_step:.2f}"],
           ["training step of a 2-layer MLP (66k params, batch 32)", f"{step_us:.1f}"],
           ["clock share of that step", f"{per_step / step_us:.2%}"]])


if __name__ == "__main__":
    main()
