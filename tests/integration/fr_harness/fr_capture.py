"""Capture the flight recorder dumps committed under tests/data/flight_recorder (run by hand:
``python tests/integration/fr_harness/fr_capture.py``); the unit tests read them back."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fr_launch import run_with_recorder  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"
CASES = {  # folder: (fixture, options)
    "some_ranks": ("hang_collective_some_ranks.py", {}),
    "stuck": ("hang_rank_stuck_in_own_code.py", {}),
    "killed": ("kill_rank.py", {"monitor_interval_s": 2.0}),  # rank 0 writes its error file (test_postmortem)
    "subgroup": ("hang_subgroup_mismatch.py", {"nproc": 4}),
    "ring": ("hang_rank_stuck_in_own_code.py", {"buffer_size": 6}),
    "json": ("hang_reduce_shape_mismatch.py", {"fmt": "json"}),
}


def main() -> None:
    for name, (fixture, options) in CASES.items():
        out = DATA / name
        shutil.rmtree(out, ignore_errors=True)
        code = run_with_recorder(fixture, out, **options)
        for log in (out / "logs").rglob("*"):  # keep the error files only, renamed by rank
            if log.name == "error.json":
                shutil.copy(log, out / f"error_{log.parent.name}.json")
        shutil.rmtree(out / "logs")
        for hidden in out.glob(".*"):
            hidden.unlink()
        print(name, "torchrun exit", code, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
