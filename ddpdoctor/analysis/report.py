"""The report model and its JSON form (schema ``ddpdoctor.report/1``, see design.md); what builds
it from the evidence and the checks' results is :mod:`ddpdoctor.analysis.report_builder`.

``findings`` holds root causes and independent problems only; each carries the symptoms it
explains as ``consequences``, which never count towards the exit code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.analysis.api import SEVERITY_ORDER, Finding
from ddpdoctor.schema.events import SCHEMA_VERSION
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, Status
from ddpdoctor.schema.observations import Outcome

__all__ = ["SCHEMA", "CheckStatus", "Report", "write_json"]

SCHEMA = "ddpdoctor.report/1"


@dataclass
class CheckStatus:
    id: str
    title: str
    status: Status
    summary: str
    error: Optional[str] = None  # the check itself crashed
    incomplete: list[str] = field(default_factory=list)  # probes that failed, leaving it partly blind
    # Its findings are symptoms of another check's root finding, listed there as consequences: the
    # status stays "pass" (they never count), renderers show a consequence mark instead of a pass.
    consequence_of: Optional[str] = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "status": self.status.value,
                               "summary": self.summary}
        if self.error:
            out["error"] = self.error
        if self.incomplete:
            out["incomplete"] = self.incomplete
        if self.consequence_of:
            out["consequence_of"] = self.consequence_of
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckStatus":
        return cls(id=data["id"], title=data["title"], status=data["status"], summary=data["summary"],
                   error=data.get("error"), incomplete=list(data.get("incomplete", [])),
                   consequence_of=data.get("consequence_of"))


@dataclass
class Report:
    """Everything ``ddpdoctor check`` concluded about one run."""

    version: str
    script: Optional[str]
    argv: list[str]
    world_size: int
    nnodes: int
    backend: str
    device: str
    outcome: str  # an Outcome: completed | failed | hung | timeout | interrupted
    duration_s: float
    launch_mode: str
    checks: list[CheckStatus] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    probe_errors: list[dict[str, Any]] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    torch_version: str = ""
    python_version: str = ""
    # {"reason": "max-steps"|"max-epochs", "at": N}: a bounded run stopped on purpose
    cut: Optional[dict[str, Any]] = None
    suppressed: list[dict[str, Any]] = field(default_factory=list)  # [{"finding", "reason", "file", "line"}]
    unused_suppressions: list[dict[str, Any]] = field(default_factory=list)  # [{"file", "line", "checks", "reason"}]
    role: str = "report"  # "peer": a non-zero rank of an existing launch; rank 0 holds the report
    peer_exit_code: int = 0
    # per rank: versions, GPUs, variables (analysis/rank_environments.py)
    environment: list[dict[str, Any]] = field(default_factory=list)
    # the reference job's collective sweep (analysis/bandwidth.py)
    collective_benchmark: Optional[dict[str, Any]] = None
    device_simulation: Optional[dict[str, Any]] = None  # {"mode", "active", "simulated", "calls", "unsupported", ...}
    # outcome "interrupted": {"signal", "exit_code" (128+N), "rank" (whose ddpdoctor got it; None: the
    # reporting one), "during" ("start-up" before any rank ran the script, else "run"), "left_out"
    # (what the stop cut off, not judged), "ranks" (where each rank was)}
    interruption: Optional[dict[str, Any]] = None
    # how the ranks were launched (Observations.launch): mode, detection, Slurm job
    launch: dict[str, Any] = field(default_factory=dict)
    # file -> {line: text} the findings point at (render/source.py)
    sources: dict[str, Any] = field(default_factory=dict)
    timeline: Optional[dict[str, Any]] = None  # per-rank steps, collectives, stalls, exits (analysis/timeline.py)
    launcher_log: list[str] = field(default_factory=list)  # torchrun's own log lines, kept off the screen
    launcher_log_path: Optional[str] = None  # where the CLI wrote them
    # {"name", "title", "version"}: the framework that built DDP (Accelerate, Lightning)
    framework: Optional[dict[str, Any]] = None
    # `ddpdoctor analyze`: {"dumps", "error_files", "logs", "formats", "notes", ...}
    post_mortem: Optional[dict[str, Any]] = None
    # {"reason", "ranks"}: ddpdoctor could not check the job (its probes did not install): no finding, exit 2
    unchecked: Optional[dict[str, Any]] = None
    # the job's data parallelism (analysis/parallelism.py): wrapper, mesh, replicate and shard dimensions
    parallelism: Optional[dict[str, Any]] = None

    def at_or_above(self, level: str) -> list[Finding]:
        threshold = SEVERITY_ORDER[level]
        return [f for f in self.findings if SEVERITY_ORDER[f.severity] >= threshold]

    def exit_code(self, fail_on: str = DEFAULT_FAIL_ON) -> int:
        """0 when no top-level finding reaches ``fail_on``, else 1 (design.md's exit-code contract);
        128+N when signal N interrupted the run, whatever was found before it; 2 when the probes could
        not install, so nothing was checked."""
        if self.role == "peer":
            return self.peer_exit_code
        if self.outcome == Outcome.INTERRUPTED and self.interruption:
            return int(self.interruption.get("exit_code") or 130)
        if self.unchecked:
            return 2  # ddpdoctor could not do its job: not a verdict on the script
        return 1 if self.at_or_above(fail_on) else 0

    def assert_clean(self, fail_on: str = DEFAULT_FAIL_ON) -> None:
        """For tests: raise AssertionError listing every top-level finding at or above ``fail_on``
        (where, what, the fix), so a test fails the way ``--fail-on`` fails a run."""
        __tracebackhide__ = True  # pytest shows the caller's line, not this method's body
        if self.outcome == Outcome.INTERRUPTED:  # not clean: it did not finish
            raise AssertionError(f"ddpdoctor: the run was interrupted by {(self.interruption or {}).get('signal')} "
                                 "before the job finished")
        if self.unchecked:
            raise AssertionError(f"ddpdoctor could not check the job: {self.unchecked.get('reason')}")
        found = self.at_or_above(fail_on)
        if not found:
            return
        lines = [f"ddpdoctor: {len(found)} finding(s) at or above {fail_on} (outcome {self.outcome}):"]
        for f in found:
            where = ""
            if f.location:
                relative = os.path.relpath(f.location.file)  # short when under the working directory
                where = f" at {f.location.file if relative.startswith('..') else relative}:{f.location.line}"
            ranks = f" (ranks {', '.join(map(str, sorted(f.ranks)))})" if f.ranks else ""
            lines += [f"{f.severity.upper()} {f.check}{where}: {f.message}{ranks}", f"    fix: {f.fix}"]
        raise AssertionError("\n".join(lines))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": self.version,
            "script": self.script,
            "argv": self.argv,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "backend": self.backend,
            "device": self.device,
            "outcome": self.outcome,
            "duration_s": round(self.duration_s, 3),
            "launch_mode": self.launch_mode,
            "evidence_schema": SCHEMA_VERSION,
            "torch_version": self.torch_version,
            "python_version": self.python_version,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "missing_ranks": self.missing_ranks,
            "checks": [c.to_json() for c in self.checks],
            "findings": [f.to_json() for f in self.findings],
            "probe_errors": self.probe_errors,
            "cut": self.cut,
            "suppressed": self.suppressed,
            "unused_suppressions": self.unused_suppressions,
            "environment": self.environment,
            "collective_benchmark": self.collective_benchmark,
            "device_simulation": self.device_simulation,
            "interruption": self.interruption,
            "launch": self.launch,
            "sources": self.sources,
            "timeline": self.timeline,
            "launcher_log": {"path": self.launcher_log_path, "lines": self.launcher_log} if self.launcher_log else None,
            "framework": self.framework,
            "post_mortem": self.post_mortem,
            "unchecked": self.unchecked,
            "parallelism": self.parallelism,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Report":
        """A report saved with ``--json``, back as a Report: CI renders JUnit, SARIF or Markdown from
        it without rerunning the job. Keys this version does not know are ignored. The installed checks
        are loaded first: each registers its evidence types, so its findings' evidence comes back typed
        (with its labels and units), not as the plain dicts of the JSON."""
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report (schema {data.get('schema')!r})")
        from ddpdoctor.analysis.registry import load_checks  # on use: importing the model needs no checks

        load_checks()
        return cls(
            version=data["version"], script=data.get("script"), argv=list(data.get("argv", [])),
            world_size=data["world_size"], nnodes=data["nnodes"], backend=data["backend"], device=data["device"],
            outcome=data["outcome"], duration_s=data["duration_s"], launch_mode=data.get("launch_mode", ""),
            checks=[CheckStatus.from_json(c) for c in data.get("checks", [])],
            findings=[Finding.from_json(f) for f in data.get("findings", [])],
            ranks=list(data.get("ranks", [])), nodes=list(data.get("nodes", [])),
            probe_errors=list(data.get("probe_errors", [])), missing_ranks=list(data.get("missing_ranks", [])),
            torch_version=data.get("torch_version", ""), python_version=data.get("python_version", ""),
            cut=data.get("cut"), suppressed=list(data.get("suppressed", [])),
            unused_suppressions=list(data.get("unused_suppressions", [])),
            environment=list(data.get("environment") or []),
            collective_benchmark=data.get("collective_benchmark"),
            device_simulation=data.get("device_simulation"),
            interruption=data.get("interruption"),
            launch=dict(data.get("launch") or {}),
            sources=dict(data.get("sources") or {}), timeline=data.get("timeline"),
            launcher_log=list((data.get("launcher_log") or {}).get("lines") or []),
            launcher_log_path=(data.get("launcher_log") or {}).get("path"),
            framework=data.get("framework"),
            post_mortem=data.get("post_mortem"),
            unchecked=data.get("unchecked"),
            parallelism=data.get("parallelism"),
        )


def write_json(report: Report, path: str) -> None:
    """Write atomically so CI never reads a half-written report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(report.to_json(), f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)
