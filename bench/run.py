"""ddpdoctor benchmarks: one command, tables on stdout, nothing asserted.

    python bench/run.py                 # every CPU section (about 25 minutes on 2 cores)
    python bench/run.py --quick         # fewer rounds and smaller sizes (about 6 minutes)
    python bench/run.py --only overhead,hangs

Sections: fingerprint (in one process), config (#22's probes in one process), overhead (step time,
interleaved with TORCH_DISTRIBUTED_DEBUG; --baseline-python adds another install's default schedule),
verdict (reference job), hangs (hang -> report), sampler (10M samples), analysis (1024 ranks),
volume (100k steps), postmortem (`ddpdoctor analyze` of 1024 ranks' flight recorder dumps), recorder
(the flight recorder's cost per step), gpu (bench/gpu.py, only where CUDA is present). Results go in
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PY, ROOT  # noqa: E402
from fingerprint_cost import bench_fingerprint  # noqa: E402
from hangs import bench_hangs  # noqa: E402
from overhead import bench_overhead  # noqa: E402
from postmortem import bench_recorder_cost, bench_scale as bench_postmortem  # noqa: E402
from scale import bench_analysis, bench_sampler, bench_volume  # noqa: E402
from verdict import bench_verdict  # noqa: E402

SECTIONS = ("fingerprint", "config", "overhead", "verdict", "hangs", "sampler", "analysis", "volume",
            "postmortem", "recorder", "gpu")


def bench_gpu(quick: bool) -> None:
    import torch

    if not torch.cuda.is_available():
        print("\ngpu: no CUDA device here, skipped (run python bench/gpu.py on a GPU machine)")
        return
    subprocess.run([PY, str(ROOT / "bench" / "gpu.py"), "--rounds", "1" if quick else "3"], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller sizes")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--baseline-python", metavar="PATH",
                        help="overhead: also time the default schedule of the ddpdoctor installed for this Python")
    parser.add_argument("--rounds", type=int, help="overhead: interleaved rounds (default 5, 1 with --quick)")
    parser.add_argument("--steps", type=int, help="overhead: steps per run (default 200, 40 with --quick)")
    parser.add_argument("--sharded", action="store_true",
                        help="overhead: the same MLP sharded with FSDP2 (fully_shard) instead of wrapped in DDP")
    parser.add_argument("--no-debug-modes", action="store_true",
                        help="overhead: leave out torchrun with TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL (quicker rounds)")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    cwd = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    quick = args.quick
    for section in chosen:
        try:
            run_section(section, cwd, quick, args.baseline_python, args.rounds, not args.no_debug_modes, args.sharded,
                        args.steps)
        except Exception as exc:  # one broken section must not hide the others' tables
            print(f"\n{section}: FAILED: {type(exc).__name__}: {exc}")
        sys.stdout.flush()


def run_section(section: str, cwd: str, quick: bool, baseline_python: str | None = None,
                rounds: int | None = None, debug_modes: bool = True, sharded: bool = False,
                steps: int | None = None) -> None:
    if section == "fingerprint":
        bench_fingerprint()
    elif section == "config":
        subprocess.run([PY, str(ROOT / "bench" / "config_cost.py")], check=False)  # its own process group
    elif section == "overhead":
        bench_overhead(cwd, rounds=rounds or (1 if quick else 5), steps=steps or (40 if quick else 200),
                       baseline_python=baseline_python, debug_modes=debug_modes, sharded=sharded)
    elif section == "verdict":
        bench_verdict(cwd, rounds=1 if quick else 3)
    elif section == "hangs":
        bench_hangs(cwd)
    elif section == "sampler":
        bench_sampler(cwd, samples=1_000_000 if quick else 10_000_000)
    elif section == "analysis":
        bench_analysis(cwd, world=256 if quick else 1024)
    elif section == "volume":
        bench_volume(cwd, steps=10_000 if quick else 100_000)
    elif section == "postmortem":
        bench_postmortem(ranks=256 if quick else 1024, entries=2000)
    elif section == "recorder":
        bench_recorder_cost(rounds=1 if quick else 5, steps=60 if quick else 110)
    elif section == "gpu":
        bench_gpu(quick)


if __name__ == "__main__":
    main()
