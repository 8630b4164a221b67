"""Hang latency: from the moment a fixture hangs (its last progress event on any rank) to the
report written and every process gone, against --hang-timeout."""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time

from common import FIXTURES, doctor, run, table

FIXTURES_THAT_HANG = ("hang_barrier_rank0.py", "hang_collective_some_ranks.py", "early_stop_rank0.py",
                      "uneven_manual_shard.py")


# Events that only training itself writes; a hung job still writes others (heartbeat-driven parts,
# cumulative counters flushed when the supervisor asks for stacks), which would make the hang look
# younger than it is.
PROGRESS_KINDS = frozenset({"init_pg", "ddp_wrap", "optimizer", "step", "collective", "join", "save",
                            "load", "dcp"})


def _last_progress(evidence: str) -> float:
    last = 0.0
    for path in glob.glob(os.path.join(evidence, "events-*.jsonl")):
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
        times = [e["t"] for e in events if e.get("kind") in PROGRESS_KINDS and not e.get("snapshot")]
        last = max(last, max(times, default=0.0))
    return last


def bench_hangs(cwd: str, hang_timeout: float = 5.0) -> None:
    rows = []
    for fixture in FIXTURES_THAT_HANG:
        evidence = tempfile.mkdtemp(prefix="bench-ev-")
        result = run(doctor(FIXTURES / fixture, "-q", "--hang-timeout", str(hang_timeout), "--keep-evidence", evidence,
                            "--json", os.path.join(evidence, "report.json")), cwd)
        finished = time.time()
        try:
            with open(os.path.join(evidence, "report.json")) as f:
                outcome = json.load(f)["outcome"]
        except (OSError, ValueError, KeyError):
            outcome = "no report"
        latency = finished - _last_progress(evidence)
        rows.append([fixture, outcome, f"{result.wall_s:.1f}", f"{latency:.1f}",
                     f"{latency - hang_timeout:+.1f}", "yes" if latency <= hang_timeout + 3 else "NO"])
    table(f"hang latency with --hang-timeout {hang_timeout:g} (target: reported within the timeout + 3 s)",
          ["fixture", "outcome", "total wall s", "hang -> report s", "beyond the timeout s", "within target"], rows)
