"""Step overhead on a ~10M-parameter DDP job, 2 gloo ranks: plain torchrun, `ddpdoctor check` with
the default schedule and with --fingerprint-every 1, and torchrun with TORCH_DISTRIBUTED_DEBUG=INFO
and =DETAIL (PyTorch's own diagnostics, for comparison). The configurations run interleaved, round
after round, so drift in the machine's speed hits them alike; a run that crashes is reported so.

``--baseline-python PATH`` (bench/run.py) adds the default schedule of another ddpdoctor install
(the Python of a venv holding an earlier build), interleaved with this one: what a change to the
probes costs, side by side.
"""

from __future__ import annotations

import re
import statistics

from common import WORKLOADS, Run, doctor, run, table, torchrun

CONFIGS = {
    "plain torchrun": ("torchrun", {}, ()),
    "ddpdoctor check (default schedule)": ("doctor", {}, ()),
    "ddpdoctor check --fingerprint-every 1": ("doctor", {}, ("--fingerprint-every", "1")),
    "torchrun, TORCH_DISTRIBUTED_DEBUG=INFO": ("torchrun", {"TORCH_DISTRIBUTED_DEBUG": "INFO"}, ()),
    "torchrun, TORCH_DISTRIBUTED_DEBUG=DETAIL": ("torchrun", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, ()),
}


def step_times(result: Run) -> tuple[float, float] | None:
    match = re.search(r"STEP_TIME_MS median ([\d.]+) mean ([\d.]+)", result.output)
    return (float(match.group(1)), float(match.group(2))) if match else None


def step_cpu_times(result: Run) -> tuple[float, float] | None:
    match = re.search(r"STEP_CPU_MS median ([\d.]+) mean ([\d.]+)", result.output)
    return (float(match.group(1)), float(match.group(2))) if match else None


def bench_overhead(cwd: str, rounds: int, steps: int, baseline_python: str | None = None) -> None:
    script = WORKLOADS / "mlp_step.py"
    args = ("--steps", str(steps))
    configs = dict(CONFIGS)
    if baseline_python:
        configs = {**dict(list(CONFIGS.items())[:2]),
                   "baseline install, default schedule": ("baseline", {}, ()),
                   **dict(list(CONFIGS.items())[2:])}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    cpu_samples: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    crashes: dict[str, list[str]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (launcher, env, options) in configs.items():
            if launcher == "torchrun":
                cmd = torchrun(script, *args)
            else:
                cmd = doctor(script, *options, script_args=args)
                if launcher == "baseline":
                    cmd = [baseline_python, *cmd[1:]]
            result = run(cmd, cwd, env)
            times = step_times(result)
            if times is None or (launcher == "torchrun" and result.returncode):
                crashes[name].append(result.crash or "no step times printed")
            else:
                samples[name].append(times)
                cpu = step_cpu_times(result)
                if cpu is not None:
                    cpu_samples[name].append(cpu)
    plain = statistics.median(m for m, _ in samples["plain torchrun"]) if samples["plain torchrun"] else None
    plain_mean = statistics.median(a for _, a in samples["plain torchrun"]) if samples["plain torchrun"] else None
    cpu_plain = statistics.median(m for m, _ in cpu_samples["plain torchrun"]) if cpu_samples["plain torchrun"] else None
    rows = []
    for name in configs:
        got = samples[name]
        crashed = f"{len(crashes[name])} of {rounds}: {', '.join(sorted(set(crashes[name])))}" if crashes[name] else "none"
        if not got or plain is None:
            rows.append([name, "-", "-", "-", "-", "-", "-", crashed])
            continue
        median = statistics.median(m for m, _ in got)
        mean = statistics.median(a for _, a in got)
        cpu = statistics.median(m for m, _ in cpu_samples[name]) if cpu_samples[name] else None
        cpu_cells = ([f"{cpu:.1f}", f"{100 * (cpu / cpu_plain - 1):+.1f}%"] if cpu is not None and cpu_plain
                     else ["-", "-"])
        rows.append([name, f"{median:.1f}", f"{100 * (median / plain - 1):+.1f}%", f"{mean:.1f}",
                     f"{100 * (mean / plain_mean - 1):+.1f}%", *cpu_cells, crashed])
    table(f"step overhead: MLP 9x1024 (9.5M params), 2 gloo ranks, {steps} steps, median of the steps after 10 "
          f"warm-up; the median over {rounds} interleaved rounds; CPU ms: rank 0's process CPU time per step "
          f"(median), which waiting for a core on a shared machine does not inflate",
          ["configuration", "median step ms", "vs plain", "mean step ms", "vs plain", "median step CPU ms", "vs plain",
           "crashed runs"], rows)
