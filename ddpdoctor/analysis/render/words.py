"""What every renderer says alike, in the same words: the verdict, the run's duration, when the
ranks' places were taken, which root check a passing check's finding is a consequence of, the line
on device simulation, sizes in bytes. Plain strings: the terminal, HTML and Markdown renderers each
take them from here, and none imports another."""

from __future__ import annotations

import os

from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.analysis.report import CheckStatus, Report
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, Finding
from ddpdoctor.schema.observations import Outcome
from ddpdoctor.schema.settings import GPU_VISIBLE

__all__ = ["verdict", "duration_text", "stop_words", "consequence_of", "device_simulation_line", "parallelism_line",
           "format_bytes"]


def duration_text(seconds: float, *, post_mortem: bool = False, unit: str = "s") -> str:
    """The run's wall time. A post-mortem knows none (only what the job's files say): then the
    time ddpdoctor took to read them, said as such."""
    return f"post-mortem, its files read in {seconds:.1f}{unit}" if post_mortem else f"{seconds:.1f}{unit}"


def stop_words(post_mortem: bool) -> str:
    """When the ranks' places were taken: ddpdoctor stopped a live job; a post-mortem has the dumps."""
    return "when its flight recorder dump was written" if post_mortem else "when the job was stopped"


def verdict(report: Report, fail_on: str = DEFAULT_FAIL_ON) -> str:
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in ("error", "warning", "info")}
    tally = f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"
    if report.outcome == Outcome.INTERRUPTED:
        signal = (report.interruption or {}).get("signal") or "a signal"
        if (report.interruption or {}).get("during") == "start-up":
            return f"verdict: INTERRUPTED by {signal} during start-up: nothing was checked"
        return f"verdict: INTERRUPTED by {signal}: {tally} in what ran before it"
    if report.unchecked:
        return f"verdict: NOT CHECKED: ddpdoctor could not check this job: {report.unchecked.get('reason')}"
    if report.exit_code(fail_on):
        return f"verdict: NOT OK: {tally}"
    if counts["error"] or counts["warning"]:
        return f"verdict: OK at --fail-on {fail_on}: {tally}"
    suffix = f" ({counts['info']} info)" if counts["info"] else ""
    return f"verdict: OK: every check passed or had nothing to check{suffix}"


def consequence_of(check: CheckStatus, findings: Sequence[Finding]) -> Optional[str]:
    """The root check whose finding explains this check's finding, if any: the report's own field,
    else (a report saved by an older version) a passing check listed among a root's consequences."""
    if check.consequence_of:
        return check.consequence_of
    if check.status != "pass":
        return None
    return next((f.check for f in findings for c in f.consequences if c.check == check.id), None)


def device_simulation_line(simulation: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The report header's line on device simulation: what was simulated, or why ``auto`` left it off
    (an explicit CPU choice); None when there is nothing to say."""
    if not simulation:
        return None
    if not simulation.get("active"):
        reason = simulation.get("reason") or ""
        if simulation.get("mode") == "auto" and reason and reason != GPU_VISIBLE:
            return f"device simulation off (auto): {reason}"
        return None
    if not (simulation.get("simulated") or simulation.get("unsupported") or simulation.get("ignored")):
        return None  # a CPU script: nothing to stand in for
    simulated = ", ".join(simulation.get("simulated") or []) or "nothing"
    line = f"device simulation ({simulation.get('mode')}: CUDA/NCCL on CPU with gloo): {simulated}"
    if simulation.get("unsupported"):
        line += f"; cannot be simulated: {', '.join(simulation['unsupported'])}"
    if simulation.get("ignored"):
        line += f"; ignored: {', '.join(simulation['ignored'])}"
    return line


def parallelism_line(found: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The report header's line on the job's data parallelism, for anything but plain DDP over every
    rank (what most jobs are, and what the rest of the report assumes): "parallelism: FSDP2 on a 1-D
    mesh of 2; fully_shard at train.py:41"; None when there is nothing to add."""
    if not found or (found.get("wrapper") == "DDP" and not found.get("optimizer_sharding")
                     and len(found.get("replicate_groups") or []) <= 1):
        return None
    where = found.get("location")
    at = f"; {found.get('api')} at {os.path.basename(where['file'])}:{where['line']}" if where else ""
    return f"parallelism: {found.get('description')}{at}"


def format_bytes(num_bytes: int) -> str:
    """8 -> '8 B', 4096 -> '4 KiB', 2**30 -> '1 GiB' (one decimal when not whole)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
