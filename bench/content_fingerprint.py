"""What the content probe's sample fingerprint costs per step, on the CPU with one thread.

    python bench/content_fingerprint.py [--repeats 200]

Rows: the reference job's batch (64 x 1x28x28 float32), a 224x224 image batch (64 x 3x224x224
float32), a token batch (16 x 1024 int64) and a large flat batch (4096 x 512 float32, sampled to
512 rows). Columns: the median time of ddpdoctor.rank.row_hashes.row_hashes (projection on the
batch's device plus the one host copy and the hash mix), and, for the reference batch, the
reference model's training step for scale.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from ddpdoctor.rank.row_hashes import row_hashes  # noqa: E402


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def median_us(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def reference_step_us(repeats: int) -> float:
    from _synthetic import SmallCNN

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return median_us(step, max(20, repeats // 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    step = reference_step_us(args.repeats)
    batches = {
        "reference 64x1x28x28 f32": torch.randn(64, 1, 28, 28),
        "images 64x3x224x224 f32": torch.randn(64, 3, 224, 224),
        "tokens 16x1024 i64": torch.randint(0, 50_000, (16, 1024)),
        "flat 4096x512 f32": torch.randn(4096, 512),
    }
    rows = []
    for name, batch in batches.items():
        cost = median_us(lambda batch=batch: row_hashes(batch), args.repeats)
        share = f"{100 * cost / step:.1f}%" if name.startswith("reference") else ""
        rows.append([name, f"{cost:.0f}", share])
    table(f"content fingerprint per batch (CPU, 1 thread, median of {args.repeats}; reference training step "
          f"{step / 1000:.2f} ms)", ["batch", "fingerprint us", "of the reference step"], rows)


if __name__ == "__main__":
    main()
