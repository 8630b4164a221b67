"""``analyze(paths) -> Report``: the report of a job that already hung or failed, from its flight
recorder dumps, torchrun error files and logs, through the same checks ``run(config)`` uses.

Only the checks the dumps can inform run: a dump records collectives, not gradients, samplers or
checkpoints, and the other checks would report their absence as a problem.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

from ddpdoctor._version import __version__
from ddpdoctor.analysis.evidence import no_cyclic_gc
from ddpdoctor.analysis.api import POSTMORTEM
from ddpdoctor.analysis.registry import checks_for
from ddpdoctor.analysis.report import Report
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze as run_checks
from ddpdoctor.analysis.runner import select_checks
from ddpdoctor.analysis.suppression import scan_files
from ddpdoctor.analysis.symptoms import RankFailed
from ddpdoctor.postmortem.to_evidence import PostMortem, load
from ddpdoctor.supervisor.hang import classify

__all__ = ["PostMortemReport", "analyze"]


@dataclass
class PostMortemReport:
    report: Report
    postmortem: PostMortem

    def notes(self) -> list[str]:
        """What the inputs could not show, and torchrun's root cause when it named a victim."""
        notes = list(self.postmortem.notes)
        named = self.postmortem.torchrun_root_cause
        failure = next((f for f in self.report.findings if isinstance(f.evidence, RankFailed)), None)
        if named is not None and (failure is None or named not in failure.ranks):
            cause = f"the cause is rank {', '.join(map(str, failure.ranks))}" if failure and failure.ranks else \
                "the findings below name the cause"
            notes.append(f"torchrun's \"first observed failure\" was rank {named}: the earliest error file or exit "
                         f"it saw, not the cause; {cause}")
        return notes


def analyze(paths: list[str], *, world_size: Optional[int] = None, select: Iterable[str] = (),
            ignore: Iterable[str] = ()) -> PostMortemReport:
    """Diagnose the job whose files are in ``paths`` (ValueError for unusable input)."""
    started = time.monotonic()
    with no_cyclic_gc():
        with _pool() as map_chunks:
            postmortem = load(paths, classify=classify, world_size=world_size, map_chunks=map_chunks)
        return _report(paths, postmortem, started=started, select=select, ignore=ignore)


@contextlib.contextmanager
def _pool() -> Iterator[Optional[Callable]]:
    """map(function, chunks) over the CPUs' processes, for converting a thousand dumps; forked, so the
    workers start at once (spawned ones would import everything again)."""
    workers = min(os.cpu_count() or 1, 8)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
    try:
        yield pool.map
    finally:
        pool.shutdown(cancel_futures=True)


def _report(paths: list[str], postmortem: PostMortem, *, started: float, select: Iterable[str],
            ignore: Iterable[str]) -> PostMortemReport:
    checks = select_checks(checks_for(POSTMORTEM), tuple(select), tuple(ignore))
    evidence = postmortem.evidence
    sites = {id(site): site for rank_evidence in evidence.ranks.values() for event in rank_evidence.events
             if (site := getattr(event, "site", None))}  # shared lists: each distinct site once
    files = {frame.get("file", "") for site in sites.values() for frame in site}
    files.add(evidence.script or "")
    analysis = run_checks(evidence, checks, suppressions=scan_files(f for f in files if f and not f.startswith("<")))
    report = build_report(evidence, analysis, version=__version__, script=evidence.script, argv=list(paths),
                          duration_s=time.monotonic() - started)
    result = PostMortemReport(report=report, postmortem=postmortem)
    inputs = postmortem.inputs
    report.post_mortem = {
        "dumps": len(inputs.dumps), "error_files": len(inputs.error_files), "logs": len(inputs.logs),
        "formats": postmortem.formats, "ignored": [{"path": p, "why": why} for p, why in inputs.ignored],
        "torchrun_root_cause": postmortem.torchrun_root_cause, "notes": result.notes(),
    }
    return result
