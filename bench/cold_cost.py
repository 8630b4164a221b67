"""Why an unfingerprinted step's probe code costs more in the loop than timed alone (issue #34): the same
probe operations timed warm (repeated back to back) and cold (each after a copy of 160 MB, as an
AdamW step on the user-overhead job's 9.5M parameters streams its four arrays of 38 MB through the
caches). One process, one thread; the main thread's CPU clock, median of 40 calls each.

    python bench/cold_cost.py [--calls 40] [--evict-mb 160]

The operations: writing one Step event through a real Recorder (what every step writes), its JSON
encoding alone, the row hashes of a batch of 64 rows of 1024 floats (what every DataLoader batch
gets), and a bare ``torch.mm`` of two 4x4 matrices (a torch call with nothing to compute).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Callable

import torch

from ddpdoctor.rank import row_hashes
from ddpdoctor.rank.recorder import _ENCODER, Recorder
from ddpdoctor.schema.events import Step
from ddpdoctor.schema.settings import RankSettings


def timed(operation: Callable[[], object], calls: int, evict: Callable[[], None] | None) -> float:
    """The median main-thread CPU microseconds of ``operation``, each call after ``evict`` (if any)."""
    spent = []
    for _ in range(calls):
        if evict is not None:
            evict()
        start = time.thread_time()
        operation()
        spent.append(time.thread_time() - start)
    return statistics.median(spent) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--evict-mb", type=int, default=160, help="bytes copied before each cold call")
    args = parser.parse_args()
    torch.set_num_threads(1)
    source = torch.ones(args.evict_mb << 18)  # float32: 4 bytes each, half the copy read and half written
    target = torch.empty_like(source)
    batch = torch.randn(64, 1024)
    small = torch.ones(4, 4, dtype=torch.float64)
    recorder = Recorder(RankSettings(evidence_dir=tempfile.mkdtemp()))
    step = Step(opt=0, n=40, forwards=1, closure=False, timing=[0.0, 0.1, 0.05, 0.01, 0.005])
    operations: dict[str, Callable[[], object]] = {
        "a Step event written (Recorder.emit)": lambda: recorder.emit(step),
        "its JSON encoding alone": lambda: _ENCODER.encode(step.to_json()),
        "a batch's row hashes (64 x 1024 float32)": lambda: row_hashes.row_hashes(batch),
        "torch.mm of 4x4 float64": lambda: torch.mm(small, small),
    }
    print(f"| operation | warm us | after a {args.evict_mb} MB copy us | ratio |")
    print("|---|---|---|---|")
    for label, operation in operations.items():
        warm = timed(operation, args.calls, None)
        cold = timed(operation, args.calls, lambda: target.copy_(source))
        print(f"| {label} | {warm:.1f} | {cold:.1f} | {cold / warm:.1f}x |", flush=True)
    recorder.close()


if __name__ == "__main__":
    main()
