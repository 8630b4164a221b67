"""Two hosts without a shared filesystem (network + mount + UTS namespaces, tests/integration/two_hosts.py):
the tiny DDP job on 2 hosts x 2 ranks under one torchrun agent per host with c10d rendezvous over
the veth link, plain and inside `ddpdoctor check`, interleaved; and the time to set the namespaces
up. Needs root.

    python bench/two_hosts.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from common import ENV, PY, WORKLOADS, table  # noqa: E402

import two_hosts  # noqa: E402

TINY = WORKLOADS / "tiny_ddp.py"


def _torchrun(hosts: two_hosts.TwoHosts, host: str, *tail: str) -> list[str]:
    first = hosts.names[0]
    return [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={hosts.address[first]}:29400", f"--rdzv-id=bench-{os.getpid()}",
            f"--local-addr={hosts.address[host]}", "--max-restarts=0", *tail]


def bench_two_hosts(rounds: int) -> None:
    reason = two_hosts.unavailable()
    if reason:
        print(f"two hosts: skipped ({reason})")
        return
    setup, plain, doctor, retries = [], [], [], 0
    with tempfile.TemporaryDirectory(dir="/run") as shared:  # outside /tmp: each host has its own
        report = os.path.join(shared, "report.json")
        while len(doctor) < rounds:
            started = time.monotonic()
            with two_hosts.TwoHosts() as hosts:
                up = time.monotonic() - started
                timed = []
                for tail in ([str(TINY)], ["-m", "ddpdoctor", "check", str(TINY), "--json", report, "--plain"]):
                    started = time.monotonic()
                    try:
                        results = hosts.run({h: _torchrun(hosts, h, *tail) for h in hosts.names}, env=ENV,
                                            cwd=shared, timeout_s=120)
                    except subprocess.TimeoutExpired:
                        results = {}
                    if not results or any(r.returncode != 0 for r in results.values()):
                        break  # torch's own teardown abort ("terminate called without an active exception")
                    timed.append(time.monotonic() - started)
            if len(timed) < 2:
                retries += 1
                assert retries <= 2 * rounds, "too many failed rounds"
                continue
            setup.append(up)
            plain.append(timed[0])
            doctor.append(timed[1])
    p, d = statistics.median(plain), statistics.median(doctor)
    table(f"two hosts (network namespaces, veth, private /tmp): tiny_ddp.py, 2 hosts x 2 ranks "
          f"({rounds} rounds, medians)",
          ["namespaces up s", "plain torchrun s", "ddpdoctor check s", "ratio", "rounds retried"],
          [[f"{statistics.median(setup):.2f}", f"{p:.1f}", f"{d:.1f}", f"{d / p:.2f}x", retries]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    bench_two_hosts(parser.parse_args().rounds)


if __name__ == "__main__":
    main()
