"""`ddpdoctor analyze` at scale, and what the flight recorder costs a training step.

    python bench/postmortem.py --ranks 1024 --entries 2000    # synthetic dumps of a hung job
    python bench/postmortem.py --recorder-cost                 # step time with the recorder off/on

Scale: each rank's dump is what torch 2.13 writes for a DDP job deep into training (its ring buffer
wrapped long ago): ``--entries`` entries of two gradient-bucket all-reduces from ``loss.backward()``
and a metric ``all_reduce`` per step, each with a 9-frame Python stack, pickled with shared strings
as torch's pickler memoizes them. One rank is stuck in its own code one step behind; every other
rank waits in the next backward. ``ddpdoctor analyze`` runs on the folder in a fresh process;
its wall time and peak RSS are measured, and its finding must name that rank.

Recorder cost: bench/workloads/mlp_step.py under plain torchrun, TORCH_FR_BUFFER_SIZE=0 and =2000
interleaved, median step time of each, for a 9.5M-parameter MLP and a tiny one.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ENV, PY, ROOT, table  # noqa: E402

SITE = "/venv/lib/python3.11/site-packages"
SCRIPT = "/job/train.py"
STUCK_RANK_FRACTION = 0.505  # the culprit sits in the middle of the job


def _frames(kind: str) -> list[tuple[str, str, int]]:
    """(name, file, line) innermost first, for one kind of entry."""
    outer = [("train_step", SCRIPT, 88), ("train", SCRIPT, 131), ("main", SCRIPT, 170), ("<module>", SCRIPT, 175)]
    if kind == "backward":
        return [("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 979),
                ("backward", f"{SITE}/torch/autograd/__init__.py", 395),
                ("backward", f"{SITE}/torch/_tensor.py", 623), *outer]
    return [("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3245),
            ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
            ("log_metrics", SCRIPT, 61), *outer]


def _pattern() -> list[tuple[str, list, str]]:
    """One training step's collectives: (kind, input sizes, profiling name)."""
    return [("backward", [[2_500_000]], "gloo:all_reduce"), ("backward", [[1_200_000]], "gloo:all_reduce"),
            ("metric", [[1]], "gloo:all_reduce")]


def write_dumps(folder: Path, *, ranks: int, entries: int, first_step: int = 40_000) -> tuple[int, int]:
    """One pickle per rank, ``fr_trace_rank_<rank>``; returns (the stuck rank, its last collective)."""
    strings: dict = {}

    def s(value: str) -> str:  # one object per distinct string, as torch's pickler memoizes them
        return strings.setdefault(value, value)

    kinds = {k: [{"name": s(n), "filename": s(f), "line": line} for n, f, line in _frames(k)]
             for k in ("backward", "metric")}
    pattern = _pattern()
    stuck = int(ranks * STUCK_RANK_FRACTION)
    start_ns = time.time_ns() - 600 * 10**9  # the job hung ten minutes before its ranks dumped
    last_n = first_step * len(pattern) + entries  # every healthy rank's last (pending) collective
    for rank in range(ranks):
        end = last_n if rank != stuck else last_n - 1  # the stuck rank never issued the last one
        start = end - entries + 1
        out = []
        for n in range(start, end + 1):
            kind, sizes, name = pattern[(n - 1) % len(pattern)]
            out.append({
                "record_id": n + 1000, "pg_id": 0, "process_group": (s("0"), s("default_pg")),
                "thread_name": s("python3"), "thread_id": s("140000000000000"), "collective_seq_id": n,
                "p2p_seq_id": 0, "op_id": n, "profiling_name": s(name), "time_created_ns": start_ns
                + (n - end) * 50_000_000, "input_sizes": sizes, "input_dtypes": [s("Float")], "output_sizes": sizes,
                "output_dtypes": [s("Float")], "state": s("scheduled"), "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None, "retired": n != last_n, "timeout_ms": 600_000,
                "is_p2p": False, "frames": [dict(f) for f in kinds[kind]]})
        dump = {"version": s("2.10"), "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                "comm_lib_version": "", "pg_status": {"0": {"last_enqueued_collective": end,
                                                            "last_started_collective": -1,
                                                            "last_completed_collective": last_n - 1}},
                "entries": out}
        with open(folder / f"fr_trace_rank_{rank}", "wb") as f:
            pickle.dump(dump, f, protocol=2)
    return stuck, last_n - 1


def bench_scale(*, ranks: int, entries: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ddpdoctor-fr-bench-"))
    try:
        started = time.monotonic()
        stuck, stuck_last = write_dumps(folder, ranks=ranks, entries=entries)
        written_s = time.monotonic() - started
        size = sum(p.stat().st_size for p in folder.iterdir())
        report = folder.parent / f"{folder.name}.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.monotonic()
        proc = subprocess.run([PY, "-m", "ddpdoctor", "analyze", str(folder), "--json", str(report), "--plain"],
                              env=ENV, capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - started
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        data = json.loads(report.read_text()) if report.exists() else {"findings": []}
        report.unlink(missing_ok=True)
        finding = next(iter(data["findings"]), {})
        named = f"rank {stuck} is not inside a collective" in finding.get("message", "")
        rows = [[ranks, entries, f"{size / 2**20:.0f} MiB", f"{written_s:.1f} s", f"{wall:.1f} s",
                 f"{peak_kib / 2**20:.2f} GiB" if peak_kib > before else "n/a",
                 f"{finding.get('check')} {finding.get('severity')}, "
                 f"#{(finding.get('evidence') or {}).get('sequence')}",
                 "yes" if named else f"NO: {proc.stdout[-500:]}"]]
        table(f"analyze: {ranks} ranks of flight recorder dumps (rank {stuck} stuck after #{stuck_last})",
              ["ranks", "entries/rank", "dumps", "written in", "analyze wall", "peak RSS", "root finding",
               "culprit named"], rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_recorder_cost(*, rounds: int, steps: int) -> None:
    """Median DDP step under plain torchrun with TORCH_FR_BUFFER_SIZE=0 (off) and 2000 (on), the runs
    interleaved, for the 9.5M-parameter MLP of bench/workloads and for a tiny one whose step is
    almost only its collectives (the recorder's cost is per collective: a Python stack each)."""
    workload = ROOT / "bench" / "workloads" / "mlp_step.py"
    models = {"MLP 9.5M params": ("--width", "1024", "--depth", "9"),
              "MLP 4k params": ("--width", "32", "--depth", "2")}
    rows = []
    for name, model in models.items():
        times: dict[str, list[float]] = {"0": [], "2000": []}
        for _ in range(rounds):
            for size in ("0", "2000"):
                env = {**ENV, "TORCH_FR_BUFFER_SIZE": size, "OMP_NUM_THREADS": "1"}
                proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                       str(workload), "--steps", str(steps), *model], env=env, capture_output=True,
                                      text=True, timeout=900)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("STEP_TIME_MS")), None)
                if line is None:
                    raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
                times[size].append(float(line.split()[2]))
        off, on = statistics.median(times["0"]), statistics.median(times["2000"])
        rows.append([name, f"{off:.3f} ms", f"{on:.3f} ms", f"{(on - off) * 1000:+.0f} us",
                     f"{(on - off) / off * 100:+.1f}%"])
    table(f"flight recorder cost per DDP step (2 gloo ranks, {steps} steps, median of {rounds} interleaved runs)",
          ["model", "recorder off (0)", "on (2000)", "per step", "relative"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--recorder-cost", action="store_true", help="measure the recorder's cost per step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=110)
    args = parser.parse_args()
    if args.recorder_cost:
        bench_recorder_cost(rounds=args.rounds, steps=args.steps)
    else:
        bench_scale(ranks=args.ranks, entries=args.entries)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
