"""Where a run's seconds go, process by process: start, end and CPU seconds of every process a
command starts (the supervisor, torchrun's agent, the ranks), read from /proc every 10 ms.

    python bench/process_times.py [--rounds 3] -- COMMAND [ARGS...]
    python bench/process_times.py -- python -m ddpdoctor check fixtures/reference.py --plain -q
    python bench/process_times.py -- torchrun --standalone --nproc-per-node 2 fixtures/reference.py

Linux only. Prints one table per round; asserts nothing. A process that lives under 10 ms may be
missed, and CPU seconds are read at the last sample before a process exits (up to 10 ms short).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from common import process_tree, table

_HZ = os.sysconf("SC_CLK_TCK")


def _sample(pid: int) -> tuple[float, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _HZ, cmdline


def one_run(command: list[str]) -> tuple[list[list[str]], float]:
    seen: dict[int, list] = {}  # pid -> [cpu s, first seen, last seen, command line]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        now = time.perf_counter() - started
        for pid in process_tree(proc.pid):
            sample = _sample(pid)
            if sample is None:
                continue
            entry = seen.setdefault(pid, [0.0, now, now, sample[1]])
            entry[0], entry[2] = sample[0], now
            entry[3] = sample[1] or entry[3]  # after exec: a forked child shows its parent's at first
        time.sleep(0.01)
    wall = time.perf_counter() - started
    rows = [[str(pid), f"{cpu:.2f}", f"{first:.2f}", f"{last:.2f}", command_line[:90]]
            for pid, (cpu, first, last, command_line) in sorted(seen.items())]
    return rows, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to time after --")
    for round_ in range(args.rounds):
        rows, wall = one_run(command)
        total = sum(float(r[1]) for r in rows)
        table(f"round {round_ + 1}: {wall:.2f} s wall, {total:.2f} CPU s in {len(rows)} processes",
              ["pid", "cpu s", "first seen s", "last seen s", "command"], rows)


if __name__ == "__main__":
    main()
