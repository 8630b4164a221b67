"""Fixed cost per run (issue #19 item 1): time to verdict against plain torchrun, on the reference
job and on scripts that exit at once, for this checkout and optionally a baseline install, all
interleaved round by round so the machine's drift hits every configuration alike.

    python bench/fixed_cost.py [--rounds 5] [--baseline-python /path/to/other/venv/bin/python]

Prints a table (median wall seconds and the ratio to plain torchrun); asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import FIXTURES, PY, run, table, torchrun

SCRIPTS = {
    "reference job": None,  # the built-in reference job; plain torchrun runs fixtures/reference.py
    "script that exits at once (`pass`)": "pass\n",
    "script that imports torch and exits": "import torch\n",
}


def _check(python: str, script: Path | None) -> list[str]:
    return [python, "-m", "ddpdoctor", "check", *([str(script)] if script else []), "--plain", "-q"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-python", help="the python of another ddpdoctor install, timed beside this one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        paths: dict[str, Path | None] = {}
        for label, source in SCRIPTS.items():
            if source is None:
                paths[label] = None
            else:
                paths[label] = Path(cwd) / f"script{len(paths)}.py"
                paths[label].write_text(source)
        launches = {"plain torchrun": None, "ddpdoctor check (this checkout)": PY}
        if args.baseline_python:
            launches["ddpdoctor check (baseline)"] = args.baseline_python
        times: dict[tuple[str, str], list[float]] = {(s, launch): [] for s in SCRIPTS for launch in launches}
        crashes: dict[tuple[str, str], list[str]] = {(s, launch): [] for s in SCRIPTS for launch in launches}
        for _ in range(args.rounds):
            for label, path in paths.items():
                for launch, python in launches.items():
                    if python is None:
                        cmd = torchrun(path if path is not None else FIXTURES / "reference.py")
                    else:
                        cmd = _check(python, path)
                    result = run(cmd, cwd)
                    # a script that never calls init_process_group is a finding (exit 1), not a failure
                    if result.returncode not in ((0, 1) if python is not None and path is not None else (0,)):
                        # counted and left out of the times, as the overhead bench does: plain torchrun's
                        # reference job dies now and then in gloo's teardown ("terminate called without
                        # an active exception", SIGABRT after its last line), with or without ddpdoctor
                        crashes[(label, launch)].append(result.crash or f"exit {result.returncode}")
                        continue
                    times[(label, launch)].append(result.wall_s)
        rows = []
        for label in SCRIPTS:
            plain = statistics.median(times[(label, "plain torchrun")]) if times[(label, "plain torchrun")] else None
            for launch in launches:
                samples = times[(label, launch)]
                crashed = crashes[(label, launch)]
                crashed_text = f"{len(crashed)}: {', '.join(sorted(set(crashed)))}" if crashed else "none"
                if not samples:
                    rows.append([label, launch, "-", "-", "-", "-", crashed_text])
                    continue
                median = statistics.median(samples)
                rows.append([label, launch, f"{median:.2f}", f"{min(samples):.2f}-{max(samples):.2f}",
                             f"{median / plain:.2f}" if plain else "-", f"{median - plain:+.2f}" if plain else "-",
                             crashed_text])
        table(f"fixed cost per run, 2 gloo ranks, median of {args.rounds} interleaved rounds (crashed runs left out)",
              ["script", "launch", "wall s", "range", "ratio", "added s", "crashed runs"], rows)


if __name__ == "__main__":
    main()
