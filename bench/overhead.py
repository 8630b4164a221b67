"""Step overhead on a ~10M-parameter DDP job, 2 gloo ranks: plain torchrun, `ddpdoctor check` with
the default schedule and with --fingerprint-every 1, and torchrun with TORCH_DISTRIBUTED_DEBUG=INFO
and =DETAIL (PyTorch's own diagnostics, for comparison). The configurations run interleaved, round
after round, so drift in the machine's speed hits them alike; a run that crashes is reported so.

``--baseline-python PATH`` (bench/run.py) adds the default schedule and every-step fingerprints of another
ddpdoctor install (the Python of a venv holding an earlier build), interleaved with this one: what a change
to the probes costs, side by side.
"""

from __future__ import annotations

import re
import statistics

from common import WORKLOADS, Run, doctor, run, table, torchrun

CONFIGS = {
    "plain torchrun": ("torchrun", {}, ()),
    "ddpdoctor check (default schedule)": ("doctor", {}, ()),
    "ddpdoctor check --fingerprint-every 1": ("doctor", {}, ("--fingerprint-every", "1")),
    "ddpdoctor check --fingerprint-every 2": ("doctor", {}, ("--fingerprint-every", "2")),
    "torchrun, TORCH_DISTRIBUTED_DEBUG=INFO": ("torchrun", {"TORCH_DISTRIBUTED_DEBUG": "INFO"}, ()),
    "torchrun, TORCH_DISTRIBUTED_DEBUG=DETAIL": ("torchrun", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, ()),
}


def step_times(result: Run) -> tuple[float, float] | None:
    match = re.search(r"STEP_TIME_MS median ([\d.]+) mean ([\d.]+)", result.output)
    return (float(match.group(1)), float(match.group(2))) if match else None


def parity_ratio(result: Run) -> float | None:
    """The median odd step over the median even step of one run (see workloads/mlp_step.py)."""
    match = re.search(r"STEP_PARITY_MS odd ([\d.]+) even ([\d.]+)", result.output)
    return float(match.group(1)) / float(match.group(2)) if match else None


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}" if len(values) > 1 else "-"


def bench_overhead(cwd: str, rounds: int, steps: int, baseline_python: str | None = None,
                   debug_modes: bool = True, sharded: bool = False) -> None:
    """Each round runs every configuration once, in turn; a configuration's overhead is its median
    step over plain torchrun's median step in the same round (paired, so the machine's drift between
    rounds cancels), then the median of those ratios over the rounds with their range as the spread.
    Ranks are pinned to a core each."""
    script = WORKLOADS / "mlp_step.py"
    args = ("--steps", str(steps), "--pin", *(("--fsdp",) if sharded else ()))
    configs: dict[str, tuple] = {}
    for name, (launcher, env, options) in CONFIGS.items():
        if not debug_modes and "DEBUG" in name:
            continue
        configs[name] = (launcher, env, options)
        if baseline_python and launcher == "doctor":  # right after the configuration it is compared with
            configs[f"baseline install, {' '.join(options) or 'default schedule'}"] = ("baseline", env, options)
    ratios: dict[str, list[float]] = {name: [] for name in configs}
    mean_ratios: dict[str, list[float]] = {name: [] for name in configs}
    medians: dict[str, list[float]] = {name: [] for name in configs}
    crashes: dict[str, list[str]] = {name: [] for name in configs}
    parities: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        this_round: dict[str, tuple[float, float]] = {}
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
                this_round[name] = times
                medians[name].append(times[0])
                parity = parity_ratio(result)
                if parity is not None:
                    parities[name].append(parity)
        plain = this_round.get("plain torchrun")
        for name, (median, mean) in this_round.items():
            if plain:
                ratios[name].append(median / plain[0])
                mean_ratios[name].append(mean / plain[1])
    rows = []
    for name in configs:
        crashed = (f"{len(crashes[name])} of {rounds}: {', '.join(sorted(set(crashes[name])))}" if crashes[name]
                   else "none")
        if not ratios[name]:
            rows.append([name, "-", "-", "-", "-", "-", crashed])
            continue
        rows.append([name, f"{statistics.median(medians[name]):.1f}", f"{statistics.median(ratios[name]):.3f}x",
                     _spread(ratios[name]), f"{statistics.median(mean_ratios[name]):.3f}x", _spread(mean_ratios[name]),
                     crashed])
    model = "MLP 9x1024 (9.5M params) sharded with FSDP2" if sharded else "MLP 9x1024 (9.5M params) under DDP"
    table(f"step overhead: {model}, 2 gloo ranks pinned to a core each, {steps} steps, median and "
          f"mean of the steps after 10 warm-up; each ratio is against plain torchrun in the same round, the median "
          f"over {rounds} interleaved rounds and its range",
          ["configuration", "median step ms", "median vs plain", "range", "mean vs plain", "range", "crashed runs"],
          rows)
    table("the same runs, step beside step: the median odd step over the median even step of each run (under "
          "--fingerprint-every 2 the odd steps are fingerprinted and the even ones not, so this is a fingerprint's "
          "cost with the drift between runs left out; elsewhere both kinds of steps are alike and it shows the "
          "method's resolution), the median over the rounds and its range",
          ["configuration", "odd / even step", "range"],
          [[name, f"{statistics.median(values):.3f}x", _spread(values)] for name, values in parities.items() if values])
