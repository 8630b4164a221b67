"""Does the every-step overhead of the short user-overhead job follow the job's length or its dataset's size?
(issue #34). The 40-step job of bench/user_overhead.py holds a dataset 5x smaller than the 200-step job's
(the workload sizes it by --steps: 21 MB against 105 MB). This runs the 40-step job with the dataset sized
for each of --sizes steps (the workload's --dataset-steps; the loop still stops at 40), plain torchrun and
`ddpdoctor check --fingerprint-every 1`, interleaved round after round, with glibc's thresholds fixed as
user_overhead.py's --steady-malloc does. Prints each size's mean-step ratio (median and rounds) and each
configuration's main-thread CPU per step (steps 11 on, both ranks pooled): that clock leaves out what the
other processes take of the two cores, where the rounds' wall times move by ±15%. Asserts nothing.

    python bench/dataset_size.py [--rounds 6] [--steps 40] [--sizes 40,200]
"""

from __future__ import annotations

import argparse
import math
import statistics

from common import WORKLOADS, doctor, run, torchrun
from user_overhead import JOB_ARGS, STEADY_MALLOC, measure, step_cpu

CONFIGS = ("plain torchrun", "ddpdoctor check --fingerprint-every 1")


def bench(rounds: int, steps: int, sizes: list[int]) -> None:
    script = WORKLOADS / "mlp_step.py"
    means: dict[tuple[int, str], list[float]] = {}
    cpu: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for size in sizes:
            args = ("--steps", str(steps), "--dataset-steps", str(size), *JOB_ARGS)
            for name in CONFIGS:
                cmd = torchrun(script, *args) if name == CONFIGS[0] else doctor(
                    script, "--fingerprint-every", "1", script_args=args)
                output = run(cmd, "/tmp", env=STEADY_MALLOC).output
                measured = measure(output)
                means.setdefault((size, name), []).append(measured[0][0] if measured else float("nan"))
                cpu.setdefault((size, name), []).extend(step_cpu(output))
    print(f"\n{steps}-step job, MLP 9x1024, AdamW, batch 64, 2 gloo ranks pinned, steady malloc; {rounds} rounds")
    for size in sizes:
        plain, every = means[(size, CONFIGS[0])], means[(size, CONFIGS[1])]
        ratios = [e / p for p, e in zip(plain, every) if not (math.isnan(p) or math.isnan(e))]  # nan: a crashed run
        print(f"dataset for {size} steps: mean step vs plain {statistics.median(ratios):.3f}x "
              f"(rounds {' '.join(f'{r:.3f}' for r in ratios)})")
        for name in CONFIGS:
            print(f"  {name}: mean step {statistics.median(means[(size, name)]):.1f} ms, main-thread CPU per step "
                  f"{statistics.median(cpu[(size, name)]):.1f} ms (steps 11+, median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sizes", default="40,200", help="comma-separated: the dataset sized for this many steps")
    args = parser.parse_args()
    bench(args.rounds, args.steps, [int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
