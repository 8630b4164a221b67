"""Time to verdict: `ddpdoctor check` on the reference job (launch, probes, analysis, report)
against plain torchrun running the same job."""

from __future__ import annotations

import statistics

from common import FIXTURES, doctor, run, table, torchrun


def bench_verdict(cwd: str, rounds: int) -> None:
    plain, checked = [], []
    for _ in range(rounds):  # interleaved
        plain.append(run(torchrun(FIXTURES / "reference.py"), cwd).wall_s)
        checked.append(run(doctor(None, "-q"), cwd).wall_s)
    p, d = statistics.median(plain), statistics.median(checked)
    table(f"time to verdict, reference job, 2 gloo ranks (median of {rounds} interleaved runs)",
          ["launch", "wall s", "ratio"],
          [["torchrun --nproc-per-node 2 reference.py", f"{p:.1f}", "1.00"],
           ["ddpdoctor check (verdict and report)", f"{d:.1f}", f"{d / p:.2f}"]])
