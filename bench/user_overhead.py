"""The overhead a user sees (issue #34): the mean step over a whole run and the training loop's wall time,
plain torchrun against `ddpdoctor check` at the default schedule and with fingerprints on every step, on
a short job (40 steps, most of them fingerprinted by default) and a long one (200 steps), interleaved
round after round; and each rank's CPU seconds (in the loop, and in the whole process) beside plain
torchrun's, and each step's main-thread CPU (median, 10th percentile and minimum over both ranks'
steps from the 11th): where the probes' work shows without the other processes' noise. ``--configs every2``
adds `--fingerprint-every 2`, whose odd steps are fingerprinted: their ratio to the even steps of the same
run is a fingerprint's cost that the machine's drift between runs does not reach.

    python bench/user_overhead.py [--rounds 3] [--steps 40,200] [--baseline-python PY] [--cwd DIR] [--steady-malloc]
                                  [--configs default,every,native,every2]

``--cwd``: where the runs start; outside the checkout when ``--baseline-python`` is an earlier build
on PYTHONPATH (``python -m ddpdoctor`` run inside the checkout imports the checkout's).

The job: the 9.5M-parameter MLP of bench/workloads/mlp_step.py with AdamW, batch 64, 2 gloo ranks
pinned to a core each, one thread per rank. Each ratio is paired with plain torchrun in the same round
(run first in even rounds, last in odd ones), then the median over the rounds with its range. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess

from common import WORKLOADS, doctor, run, table, torchrun
from overhead import parity_ratio

from ddpdoctor.schema.sampling import should_fingerprint

CONFIGS = {
    "plain torchrun": ("torchrun", ()),
    "ddpdoctor check (default schedule)": ("doctor", ()),
    "ddpdoctor check --fingerprint-every 1": ("doctor", ("--fingerprint-every", "1")),
    # on a machine with no GPU, --device auto simulates one per rank: the simulation's share of the cost
    "ddpdoctor check --device native (default schedule)": ("doctor", ("--device", "native")),
    # odd steps fingerprinted, even ones not: their ratio in one run is a fingerprint's cost out of the drift's reach
    "ddpdoctor check --fingerprint-every 2": ("doctor", ("--fingerprint-every", "2")),
}
CONFIG_NAMES = {"default": "ddpdoctor check (default schedule)", "every": "ddpdoctor check --fingerprint-every 1",
                "native": "ddpdoctor check --device native (default schedule)",
                "every2": "ddpdoctor check --fingerprint-every 2"}  # --configs; plain torchrun always
# --baseline-python: the earlier install's configuration beside each of these chosen ones
BASELINE_TWINS = {"default": "baseline install (default schedule)", "every": "baseline install --fingerprint-every 1"}
_RUN = re.compile(r"RUN rank (\d+) mean_ms ([\d.]+) loop_s ([\d.]+) loop_cpu_s ([\d.]+) process_cpu_s ([\d.]+)"
                  r" loop_faults (\d+)")
# glibc gives freed memory of big tensors back to the kernel and maps it again at a later step, as its
# dynamic thresholds see fit: the minor page faults of the same job move between 0.1 and 1.9 million per
# rank in 120 steps, run to run, plain torchrun or not, and the mean step with them by ±10%. A fixed mmap
# threshold of 32 MiB (glibc's largest) and a trim threshold out of reach keep freed memory in the heap
# (about 1000 faults a step), for plain torchrun and ddpdoctor alike: what is left is the probes' own cost.
# The trim threshold alone fixes the mmap threshold at 128 KiB: every tensor is mapped anew, 2 million faults.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 36)}
# The job (bench/workloads/mlp_step.py's options besides --steps): bench/dataset_size.py runs the same one.
JOB_ARGS = ("--pin", "--optimizer", "adamw", "--batch", "64", "--thread-cpu")
_STEP_CPU = re.compile(r"STEP_CPU_MS (\d+) (\[[-\d., ]*\])")  # two ranks' long lines may interleave: only numbers


def measure(output: str) -> dict[int, tuple[float, float, float, float, float]] | None:
    """rank -> (mean step ms, loop s, loop CPU s, process CPU s, minor faults in the loop), None when a rank
    printed nothing."""
    found = {int(m.group(1)): tuple(float(v) for v in m.groups()[1:]) for m in _RUN.finditer(output)}
    return found if len(found) == 2 else None  # type: ignore[return-value]


def step_cpu_runs(output: str) -> list[list[float]]:
    """Each rank's main-thread CPU ms of every step, in order."""
    return [json.loads(m.group(2)) for m in _STEP_CPU.finditer(output)]


def from_step_11(runs: list[list[float]]) -> list[float]:
    """The main-thread CPU ms of every run's steps from the 11th on, pooled."""
    return [ms for steps in runs for ms in steps[10:]]


def step_cpu(output: str) -> list[float]:
    """Both ranks' main-thread CPU ms of each step from the 11th on: what the probes cost a rank,
    without the other processes' share of the cores that wall times carry."""
    return from_step_11(step_cpu_runs(output))


def _every(options: tuple[str, ...]) -> int:
    """The --fingerprint-every a configuration's options give (0: the automatic schedule)."""
    return int(options[options.index("--fingerprint-every") + 1]) if "--fingerprint-every" in options else 0


def fingerprinted_steps(python: str | None, every: int, length: int, cwd: str) -> set[int]:
    """The steps (1-based) of a job of ``length`` steps that an install fingerprints under ``--fingerprint-every
    every``: this checkout's schedule, or the one of the install behind ``python`` (an earlier build's may differ)."""
    if python is None:
        return {n for n in range(1, length + 1) if should_fingerprint(n, every)}
    ask = ("import sys; from ddpdoctor.schema.sampling import should_fingerprint as f; "
           "print(*(n for n in range(1, int(sys.argv[1]) + 1) if f(n, int(sys.argv[2]))))")
    out = subprocess.run([python, "-c", ask, str(length), str(every)], cwd=cwd, capture_output=True, text=True,
                         check=True)
    return {int(n) for n in out.stdout.split()}


def step_kinds(plain: list[list[float]], runs: list[list[float]], fingerprinted: set[int]) -> list[list[str]]:
    """Where a configuration's extra main-thread CPU goes: per step index, the median over its runs' ranks less
    plain torchrun's median at the same index (both from the same interleaved rounds, so the machine's drift
    reaches both), grouped by kind. A kind's share is its extra CPU over plain's whole CPU from step 5: what it
    adds to the mean step a user sees."""
    length = min(min(map(len, plain), default=0), min(map(len, runs), default=0))
    if not length:
        return []
    base = [statistics.median(p[i] for p in plain) for i in range(length)]
    extra = [statistics.median(r[i] for r in runs) - base[i] for i in range(length)]
    kinds = {"step 1": [0], "steps 2-4": list(range(1, min(4, length))),
             "fingerprinted, step 5+": [i for i in range(4, length) if i + 1 in fingerprinted],
             "unfingerprinted, step 5+": [i for i in range(4, length) if i + 1 not in fingerprinted]}
    whole = sum(base[4:]) or 1.0
    rows = []
    for kind, indices in kinds.items():
        if not indices:
            continue
        per_step, plain_step = statistics.median(extra[i] for i in indices), statistics.median(base[i] for i in indices)
        share = f"{100 * sum(extra[i] for i in indices) / whole:+.2f}%" if indices[0] >= 4 else "-"
        rows.append([kind, str(len(indices)), f"{plain_step:.1f}", f"{per_step:+.2f}",
                     f"{100 * per_step / plain_step:+.1f}%", share])
    return rows


def _median_range(values: list[float], unit: str = "x") -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    spread = f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""
    return f"{middle:.3f}{unit}{spread}"


def bench(cwd: str, rounds: int, steps: list[int], baseline_python: str | None, steady_malloc: bool,
          chosen: list[str]) -> None:
    configs = {name: value for name, value in CONFIGS.items()
               if name == "plain torchrun" or name in [CONFIG_NAMES[c] for c in chosen]}
    if baseline_python:  # the other install's twin of each chosen schedule, with the same options
        configs.update({name: ("baseline", CONFIGS[CONFIG_NAMES[chosen_name]][1])
                        for chosen_name, name in BASELINE_TWINS.items() if chosen_name in chosen})
    script = WORKLOADS / "mlp_step.py"
    for n in steps:
        args = ("--steps", str(n), *JOB_ARGS)
        results: dict[str, list[dict]] = {name: [] for name in configs}
        parities: dict[str, list[float]] = {name: [] for name in configs}
        crashes: dict[str, int] = {name: 0 for name in configs}
        step_runs: dict[str, list[list[float]]] = {name: [] for name in configs}
        for round_ in range(rounds):
            # every other round in reverse order: a drift of the machine within a round (a neighbour's load on the
            # VM's host moves a step by 20% for minutes) then lands on plain torchrun and ddpdoctor alike
            order = list(configs.items())
            for name, (launcher, options) in order if round_ % 2 == 0 else order[::-1]:
                cmd = torchrun(script, *args) if launcher == "torchrun" else doctor(script, *options, script_args=args)
                if launcher == "baseline":
                    cmd = [baseline_python, *cmd[1:]]
                result = run(cmd, cwd, env=STEADY_MALLOC if steady_malloc else None)
                output = result.output
                measured = measure(output)
                parity = parity_ratio(result)
                if parity is not None:
                    parities[name].append(parity)
                step_runs[name].extend(step_cpu_runs(output))
                if measured is None:
                    crashes[name] += 1
                results[name].append(measured or {})
        rows = []
        for name in configs:
            mean_ratio, loop_ratio, means, cpu, process_cpu, faults = [], [], [], [], [], []
            for plain, this in zip(results["plain torchrun"], results[name]):
                if not plain or not this:
                    continue
                mean_ratio.append(this[0][0] / plain[0][0])
                loop_ratio.append(max(v[1] for v in this.values()) / max(v[1] for v in plain.values()))
                means.append(this[0][0])
                cpu.extend(v[2] for v in this.values())
                process_cpu.extend(v[3] for v in this.values())
                faults.extend(v[4] / n / 1000 for v in this.values())
            steps_cpu = sorted(from_step_11(step_runs[name]))
            p10 = steps_cpu[len(steps_cpu) // 10] if steps_cpu else 0.0
            step_cell = f"{statistics.median(steps_cpu):.1f} / {p10:.1f} / {steps_cpu[0]:.1f}" if steps_cpu else "-"
            rows.append([name, f"{statistics.median(means):.1f}" if means else "-", _median_range(mean_ratio),
                         _median_range(loop_ratio), _median_range(cpu, " s"), _median_range(process_cpu, " s"),
                         step_cell, _median_range(faults, ""), crashes[name]])
        table(f"what a user sees, {n} steps: MLP 9x1024 (9.5M params), AdamW, batch 64, 2 gloo ranks pinned, one "
              f"thread each; {rounds} interleaved rounds, each ratio against plain torchrun in its round "
              f"(median, range){'; steady malloc' if steady_malloc else ''}",
              ["configuration", "mean step ms (steps 5+)", "mean step vs plain", "loop wall vs plain",
               "CPU s per rank, loop", "CPU s per rank, process",
               "main-thread CPU ms per step, steps 11+ (median / p10 / min)",
               "thousand minor faults per step per rank", "crashed runs"], rows)
        table(f"the same runs, step beside step ({n} steps): each run's median odd step over its median even step, "
              f"from step 11 (under --fingerprint-every 2 a fingerprinted step over an unfingerprinted one of the same "
              f"run, which the machine's drift between runs does not reach; plain torchrun's is the method's "
              f"resolution), the median over the rounds and their range",
              ["configuration", "odd / even step", "runs"],
              [[name, _median_range(values), " ".join(f"{v:.3f}" for v in values)]
               for name, values in parities.items() if values and (name == "plain torchrun" or "every 2" in name)])
        kind_rows = [[name, *row] for name, (launcher, options) in configs.items() if name != "plain torchrun"
                     for row in step_kinds(step_runs["plain torchrun"], step_runs[name], fingerprinted_steps(
                         baseline_python if launcher == "baseline" else None, _every(options), n, cwd))]
        if kind_rows:
            table(f"where the extra main-thread CPU goes ({n} steps), by step kind: per step, the median over the "
                  f"runs' ranks less plain torchrun's at the same step; the kind's share of plain's CPU from step 5 "
                  f"(what it adds to the mean step)",
                  ["configuration", "kind", "steps", "plain ms per step", "extra ms per step", "extra per step",
                   "share of the mean"], kind_rows)
        for name in configs:  # each round's ratio, in the order run: what the median and the range summarize
            ratios = [f"{this[0][0] / plain[0][0]:.3f}" for plain, this in zip(results["plain torchrun"], results[name])
                      if plain and this]
            if name != "plain torchrun":
                print(f"rounds, {name}: {' '.join(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", default="40,200", help="comma-separated job lengths")
    parser.add_argument("--baseline-python",
                        help="also the ddpdoctor of this Python (an earlier build), in each chosen schedule of "
                             "default and every")
    parser.add_argument("--cwd", default=".")
    parser.add_argument("--steady-malloc", action="store_true",
                        help="run every configuration with glibc's mmap and trim thresholds fixed (see STEADY_MALLOC)")
    parser.add_argument("--configs", default=",".join(CONFIG_NAMES),
                        help=f"comma-separated, of {', '.join(CONFIG_NAMES)} (plain torchrun is always run)")
    args = parser.parse_args()
    chosen = [c for c in args.configs.split(",") if c]
    unknown = [c for c in chosen if c not in CONFIG_NAMES]
    if unknown:
        parser.error(f"unknown --configs {', '.join(unknown)}; choose from {', '.join(CONFIG_NAMES)}")
    bench(args.cwd, args.rounds, [int(s) for s in args.steps.split(",")], args.baseline_python, args.steady_malloc,
          chosen)


if __name__ == "__main__":
    main()
