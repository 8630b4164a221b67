"""Analyze an evidence directory kept with `ddpdoctor check --keep-evidence DIR`, timed: the bench
measures the analysis alone, without the job that produced the evidence."""

from __future__ import annotations

import time

from ddpdoctor.analysis.evidence import Evidence, parse_lines
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.schema.observations import Observations
from ddpdoctor.supervisor.transport import FileTransport


def load(directory: str) -> Evidence:
    """As the supervisor loads it: the file transport's lines, parsed with one shared pool."""
    pool: dict[str, str] = {}
    processes = (parse_lines(lines, pool) for lines in FileTransport(directory).collect().processes)
    return Evidence.from_processes(processes, observations=Observations())


def timed_analysis(directory: str) -> tuple[float, float, list]:
    """(seconds to parse the files, seconds to analyze, outcomes)."""
    start = time.perf_counter()
    evidence = load(directory)
    parsed = time.perf_counter()
    outcomes = analyze(evidence).outcomes
    return parsed - start, time.perf_counter() - parsed, outcomes
