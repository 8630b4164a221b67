"""Analyze an evidence directory kept with `ddpdoctor check --keep-evidence DIR`, timed: the bench
measures the analysis alone, without the job that produced the evidence."""

from __future__ import annotations

import glob
import os
import time

from ddpdoctor.analysis.evidence import Evidence, parse_lines
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.schema.layout import EVENTS_GLOB
from ddpdoctor.schema.observations import Observations


def load(directory: str) -> Evidence:
    processes = []
    for path in sorted(glob.glob(os.path.join(directory, EVENTS_GLOB))):
        with open(path, errors="replace") as f:
            processes.append(parse_lines(f.read().splitlines()))
    return Evidence.from_processes(processes, observations=Observations())


def timed_analysis(directory: str) -> tuple[float, float, list]:
    """(seconds to parse the files, seconds to analyze, outcomes)."""
    start = time.perf_counter()
    evidence = load(directory)
    parsed = time.perf_counter()
    outcomes = analyze(evidence).outcomes
    return parsed - start, time.perf_counter() - parsed, outcomes
