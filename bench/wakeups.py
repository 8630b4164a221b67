"""Who wakes up how often during training (issue #34's context-switch lead): every thread of every
process of a run, plain torchrun against `ddpdoctor check`, sampled from /proc over a window in the
middle of the training loop: wake-ups (voluntary context switches) and preemptions (involuntary ones)
per second, and CPU share. On a machine whose cores the ranks fill, each wake-up of another thread
lands on a rank's core.

    python bench/wakeups.py [--steps 400] [--warmup 20] [--window 10]

The job is user_overhead.py's (bench/workloads/mlp_step.py, AdamW, batch 64, ranks pinned to a core
each). Threads are grouped by process role and thread name. Linux only; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from common import ENV, WORKLOADS, doctor, process_tree, table, torchrun
from user_overhead import JOB_ARGS

_HZ = os.sysconf("SC_CLK_TCK")


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    line = " ".join(argv)
    if "-m ddpdoctor" in line or argv[0].endswith("/ddpdoctor") or argv[1:2] and argv[1].endswith("/ddpdoctor"):
        return "supervisor"
    if "agent.py" in line or "torch.distributed.run" in line:
        return "agent"
    if "mlp_step.py" in line:
        return "rank"
    return argv[0].rsplit("/", 1)[-1]


def _sample(root: int) -> dict[tuple[int, int], tuple[str, str, int, int, int]]:
    """(pid, tid) -> (role, thread name, voluntary, involuntary switches, CPU ticks)."""
    out = {}
    for pid in process_tree(root):
        role = _role(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/comm") as f:
                    name = f.read().strip()
                with open(f"{base}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                with open(f"{base}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[(pid, int(tid))] = (role, name, int(fields["voluntary_ctxt_switches"]),
                                    int(fields["nonvoluntary_ctxt_switches"]), int(stat[11]) + int(stat[12]))
    return out


def measure(label: str, cmd: list[str], warmup: float, window: float) -> list[list]:
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(warmup)
        before = _sample(proc.pid)
        time.sleep(window)
        after = _sample(proc.pid)
    finally:
        proc.wait(timeout=900)
    groups: dict[tuple[str, str], list[float]] = {}
    for key, (role, name, vol, invol, ticks) in after.items():
        if key not in before:
            continue
        _, _, vol0, invol0, ticks0 = before[key]
        acc = groups.setdefault((role, name), [0, 0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += (vol - vol0) / window
        acc[2] += (invol - invol0) / window
        acc[3] += (ticks - ticks0) / _HZ / window * 100
    return [[label, role, name, n, f"{v:.1f}", f"{i:.1f}", f"{c:.1f}"]
            for (role, name), (n, v, i, c) in sorted(groups.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before the window (start-up)")
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    job = (*JOB_ARGS, "--steps", str(args.steps))
    rows = measure("plain torchrun", torchrun(WORKLOADS / "mlp_step.py", *job), args.warmup, args.window)
    rows += measure("ddpdoctor check", doctor(WORKLOADS / "mlp_step.py", "-q", script_args=job), args.warmup,
                    args.window)
    table(f"threads over {args.window:.0f} s from {args.warmup:.0f} s into the run (sums over the threads of a group)",
          ["run", "process", "thread", "threads", "wake-ups/s", "preempted/s", "CPU %"], rows)


if __name__ == "__main__":
    main()
