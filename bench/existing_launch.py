"""ddpdoctor inside an existing launch at scale: `torchrun --standalone --nproc-per-node N -m ddpdoctor
check tiny.py` against plain `torchrun ... tiny.py`, interleaved, for N ranks on this machine.

Prints, per N: the wall time of each, the ratio, the processes the launch had at its peak, and the
peak resident memory (VmHWM) of rank 0's ddpdoctor process and of all ddpdoctor supervisors together.
``--src DIR`` runs the ddpdoctor in a source tree instead (e.g. an export of an older commit, for a
before/after table on the same machine).

    python bench/existing_launch.py --nprocs 16,32 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ENV, PY, WORKLOADS, process_tree, table  # noqa: E402

TINY = WORKLOADS / "tiny_ddp.py"


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _is_supervisor(pid: int) -> Optional[int]:
    """The rank of a `python -m ddpdoctor check` process, None for any other process (torchrun, whose
    arguments name ddpdoctor too, and a worker between fork and exec, which still looks like torchrun)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        module = cmdline.index(b"-m") + 1 if b"-m" in cmdline else -1
        if module <= 0 or cmdline[module:module + 2] != [b"ddpdoctor", b"check"]:
            return None
        env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        return int(env.get(b"RANK", b"-1"))
    except (OSError, ValueError):
        return None


class Sampler(threading.Thread):
    """Polls the launch's process tree: peak process count, supervisors' peak memory."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.max_procs = 0
        self.hwm: dict[int, int] = {}  # supervisor pid -> VmHWM KiB
        self.rank_of: dict[int, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            pids = process_tree(self.root)[1:]  # below the root
            self.max_procs = max(self.max_procs, len(pids) + 1)
            for pid in pids:
                rank = _is_supervisor(pid)  # asked every time: a pid seen before its exec is not a supervisor yet
                if rank is None:
                    continue
                self.rank_of[pid] = rank
                self.hwm[pid] = max(self.hwm.get(pid, 0), _status_kib(pid, "VmHWM"))
            self.stop.wait(0.2)


def _run(cmd: list[str], env: dict, cwd: str) -> tuple[float, int, Sampler, str]:
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    output, _ = proc.communicate(timeout=1800)
    wall = time.monotonic() - started
    sampler.stop.set()
    sampler.join()
    return wall, proc.returncode, sampler, output


def bench_existing_launch(nprocs: list[int], rounds: int, src: Optional[str]) -> None:
    env = {**ENV}
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    rows = []
    with tempfile.TemporaryDirectory() as cwd:
        for n in nprocs:
            plain_s, doctor_s, procs_plain, procs_doctor, rank0_mib, all_mib = [], [], [], [], [], []
            retried = 0
            while len(doctor_s) < rounds:
                torchrun = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
                wall, code, sampler, output = _run([*torchrun, str(TINY)], env, cwd)
                if code != 0:  # torch's teardown abort ("terminate called without an active exception"): again
                    retried += 1
                    assert retried <= 2 * rounds, output[-3000:]
                    continue
                plain_wall, plain_procs = wall, sampler.max_procs
                wall, code, sampler, output = _run([*torchrun, "-m", "ddpdoctor", "check", str(TINY), "--plain", "-q"],
                                                   env, cwd)
                if code != 0 or "verdict: OK" not in output:
                    retried += 1
                    print(f"ddpdoctor run failed, round repeated: {output[-1500:]}", file=sys.stderr)
                    assert retried <= 2 * rounds, output[-3000:]
                    continue
                plain_s.append(plain_wall)
                procs_plain.append(plain_procs)
                doctor_s.append(wall)
                procs_doctor.append(sampler.max_procs)
                rank0 = [h for pid, h in sampler.hwm.items() if sampler.rank_of.get(pid) == 0]
                rank0_mib.append(max(rank0 or [0]) / 1024)
                all_mib.append(sum(sampler.hwm.values()) / 1024)
            plain, doctor = statistics.median(plain_s), statistics.median(doctor_s)
            rows.append([n, f"{plain:.1f}", f"{doctor:.1f}", f"{doctor / plain:.2f}x",
                         f"{min(doctor_s) / min(plain_s):.2f}x", f"{max(procs_plain)} / {max(procs_doctor)}",
                         f"{statistics.median(rank0_mib):.0f}", f"{statistics.median(all_mib):.0f}", retried])
    table(f"inside an existing launch: torchrun --standalone --nproc-per-node N [-m ddpdoctor check] tiny_ddp.py "
          f"({rounds} interleaved rounds, medians; {os.cpu_count()} CPUs)",
          ["ranks", "plain s", "ddpdoctor s", "ratio", "best/best", "processes plain / ddpdoctor",
           "rank-0 ddpdoctor MiB", "all ddpdoctor MiB", "rounds repeated"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="16,32", help="comma-separated rank counts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--src", default=None, help="run the ddpdoctor source tree in DIR instead")
    args = parser.parse_args()
    bench_existing_launch([int(n) for n in args.nprocs.split(",")], args.rounds, args.src)


if __name__ == "__main__":
    main()
