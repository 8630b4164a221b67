"""Where an unfingerprinted step's extra cost comes from in the two-rank job (issue #34): plain torchrun against
`ddpdoctor check` with no fingerprint at all, the ranks running no probe, every probe, or every probe but some,
the device native or simulated; interleaved round after round, every other round in reverse order.

    python bench/probe_bisect.py [--rounds 6] [--steps 120] [--variants plain,bare,native,simulated]
                                 [--drop data,content --drop collectives]

The job is bench/user_overhead.py's (the 9.5M-parameter MLP, AdamW, batch 64, 2 gloo ranks pinned, one thread
each, steady malloc), with its dataset sized for 200 steps whatever ``--steps`` (the dataset's size moves the
step: bench/dataset_size.py). Fingerprints are off (``--fingerprint-every 1000000``), so every step is an
unfingerprinted one. The variants:
- ``bare``: ddpdoctor's launch, supervisor, agent, watchdog and rank bootstrap, no probe installed;
- ``native``: every probe, ``--device native``;
- ``simulated``: every probe and the default ``--device auto`` (on a machine without a GPU, the device simulation);
- each ``--drop A,B``: every probe but A and B (names of ddpdoctor.rank.probes.PROBE_MODULES), native.
The probes are chosen by a sitecustomize on the ranks' PYTHONPATH that narrows PROBE_MODULES before the
bootstrap installs them: a benchmark's lever, not an option of ddpdoctor's.

Prints each run, then per variant the median mean step and main-thread CPU per step (steps 11+), and their
ratios to plain torchrun's in the same round (median, range). Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import WORKLOADS, doctor, run, torchrun
from user_overhead import JOB_ARGS, STEADY_MALLOC, measure, step_cpu

from ddpdoctor.rank.probes import PROBE_MODULES

_SITECUSTOMIZE = '''import os
_keep = os.environ.get("PROBE_BISECT_KEEP")
if _keep is not None:
    import ddpdoctor.rank.probes as _probes
    _probes.PROBE_MODULES = tuple(name for name in _keep.split(",") if name)
'''
_NEVER = ("--fingerprint-every", "1000000")


def variants(steps: int, chosen: list[str], drops: list[str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    job = (*JOB_ARGS, "--steps", str(steps), "--dataset-steps", str(max(steps, 200)))
    script = WORKLOADS / "mlp_step.py"
    native = doctor(script, "--device", "native", *_NEVER, script_args=job)
    known = {"plain": (torchrun(script, *job), {}), "bare": (native, {"PROBE_BISECT_KEEP": ""}),
             "native": (native, {}), "simulated": (doctor(script, *_NEVER, script_args=job), {})}
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise SystemExit(f"unknown --variants {', '.join(unknown)}; choose from {', '.join(known)}")
    out = {name: known[name] for name in ["plain", *chosen] if name in known}
    for drop in drops:
        left_out = drop.split(",")
        unknown = [name for name in left_out if name not in PROBE_MODULES]
        if unknown:
            raise SystemExit(f"unknown probe {', '.join(unknown)} in --drop; choose from {', '.join(PROBE_MODULES)}")
        kept = ",".join(name for name in PROBE_MODULES if name not in left_out)
        out[f"without {drop}"] = (native, {"PROBE_BISECT_KEEP": kept})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--variants", default="bare,native,simulated", help="comma-separated; plain torchrun always")
    parser.add_argument("--drop", action="append", default=[], help="probes left out, comma-separated (repeatable)")
    args = parser.parse_args()
    chosen = variants(args.steps, [v for v in args.variants.split(",") if v], args.drop)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        for round_ in range(args.rounds):
            order = list(chosen.items())
            for name, (cmd, env) in order if round_ % 2 == 0 else order[::-1]:
                result = run(cmd, "/tmp", {**STEADY_MALLOC, "PYTHONPATH": site, **env})
                measured, cpu = measure(result.output), step_cpu(result.output)
                if measured is None or not cpu:
                    print(f"round {round_ + 1} {name}: no result (rc {result.returncode})\n{result.output[-1500:]}")
                    results[name].append((0.0, 0.0))
                    continue
                mean, cpu_median = statistics.fmean(values[0] for values in measured.values()), statistics.median(cpu)
                results[name].append((mean, cpu_median))
                print(f"round {round_ + 1} {name}: mean step {mean:.2f} ms, main-thread CPU median {cpu_median:.2f} ms "
                      f"({time.strftime('%H:%M:%S')})", flush=True)
    print("\n| variant | mean step ms | vs plain | main-thread CPU ms per step | vs plain |\n|---|---|---|---|---|")
    for name, rows in results.items():
        paired = [(this, plain) for this, plain in zip(rows, results["plain"]) if this[0] and plain[0]]
        if not paired:
            continue
        cells = []
        for k in (0, 1):
            ratios = [this[k] / plain[k] for this, plain in paired]
            cells += [f"{statistics.median(this[k] for this, _ in paired):.2f}",
                      f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
