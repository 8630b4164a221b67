"""Suite-wide: ddpdoctor's bytecode compiled once, and the longest modules start first.

The suite starts about a thousand Python processes (supervisors, agents, ranks), each importing part
of ddpdoctor's 22,000 lines. Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines),
no import writes a ``.pyc``, so every process compiled ddpdoctor from source again: about 0.9 CPU
seconds of a 15 CPU-second fixture run on 2 cores. The session compiles it once, before any test;
imports read bytecode even where they may not write it.

With pytest-xdist's ``--dist loadfile`` each module goes whole to the next idle worker, in
collection order (pyproject's ``--no-loadscope-reorder``: by default pytest-xdist 3.8 orders the
modules by their number of tests, which started the few-test, minutes-long modules (Slurm, two
hosts, the pytest plugin) last and left the other workers idle at the end). Starting the longest
first lets the short ones fill in around them (longest-processing-time-first scheduling).
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules by their measured wall time (summed over their tests, 3 workers on 2 cores, 2026-11-27),
# longest first; the rest keep their order.
LONGEST_FIRST = (
    "test_checks_on_fixtures.py",  # 567 s
    "test_known_good_fixtures.py",  # 491
    "test_root_causes.py",  # 309
    "test_global_batch.py",  # 293
    "test_postmortem.py",  # 282
    "test_slurm.py",  # 277
    "test_device_simulation.py",  # 225
    "test_checkpoints.py",  # 224
    "test_cli_and_launch_modes.py",  # 223
    "test_content_audit.py",  # 199
    "test_hangs_and_faults.py",  # 182
    "test_ci_gating.py",  # 139
    "test_fsdp_collectives.py",  # 103
    "test_two_hosts.py",  # 102
    "test_probes_never_hurt.py",  # 97
    "test_plugins.py",  # 91
    "test_interrupted.py",  # 80
    "test_fsdp2_checkpoints.py",  # 74
    "test_sharded_models.py",  # 71
    "test_fused_word_sums.py",  # 61
    "test_env_command.py",  # 55
    "test_pipeline.py",  # 44
    "test_device_sim.py",  # 41
    "test_zero_optimizer.py",  # 40
    "test_pytest_plugin.py",  # 39
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: in-module order kept


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, before any pytest-xdist worker starts
        for package in ("ddpdoctor", "fixtures"):  # fixtures: the helper modules fixture scripts import
            compileall.compile_dir(ROOT / package, quiet=1)
