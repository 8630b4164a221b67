"""Suite-wide: ddpdoctor's bytecode compiled once, and the longest modules start first.

The suite starts about a thousand Python processes (supervisors, agents, ranks), each importing part
of ddpdoctor's 22,000 lines. Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines),
no import writes a ``.pyc``, so every process compiled ddpdoctor from source again: about 0.9 CPU
seconds of a 15 CPU-second fixture run on 2 cores. The session compiles it once, before any test;
imports read bytecode even where they may not write it.

With pytest-xdist's ``--dist loadfile`` each module goes whole to the next idle worker, in
collection order. Alphabetical order would start the real-Slurm and two-host modules (minutes of
waiting on daemons and namespaces) last, leaving the other workers idle at the end; starting the
longest first lets the short ones fill in around them (longest-processing-time-first scheduling).
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Integration modules by their measured wall time on 2 cores, longest first; the rest keep their order.
LONGEST_FIRST = (
    "test_checks_on_fixtures.py",
    "test_device_simulation.py",
    "test_slurm.py",
    "test_postmortem.py",
    "test_root_causes.py",
    "test_hangs_and_faults.py",
    "test_content_audit.py",
    "test_known_good_fixtures.py",
    "test_training_semantics.py",
    "test_checkpoints.py",
    "test_ci_gating.py",
    "test_cli_and_launch_modes.py",
    "test_two_hosts.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: in-module order kept


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, before any pytest-xdist worker starts
        for package in ("ddpdoctor", "fixtures"):  # fixtures: the helper modules fixture scripts import
            compileall.compile_dir(ROOT / package, quiet=1)
