"""The report model and its JSON form (schema ``ddpdoctor.report/1``, see design.md).

``findings`` holds root causes and independent problems only; each carries the symptoms it
explains as ``consequences``, which never count towards the exit code.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.analysis import interruption
from ddpdoctor.analysis.api import SEVERITY_ORDER, Finding
from ddpdoctor.analysis.bandwidth import collective_benchmark
from ddpdoctor.analysis.environment import rank_environments
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.render.source import collect_sources
from ddpdoctor.analysis.runner import Analysis
from ddpdoctor.analysis.timeline import build_timeline
from ddpdoctor.schema.events import (SCHEMA_VERSION, DDPWrap, DeviceSimulation, InitProcessGroup, ProcessStart,
                                     RankEnvironment)
from ddpdoctor.schema.settings import GPU_VISIBLE

__all__ = ["SCHEMA", "CheckStatus", "Report", "build_report", "write_json"]

SCHEMA = "ddpdoctor.report/1"


@dataclass
class CheckStatus:
    id: str
    title: str
    status: str  # pass | fail | warn | skip
    summary: str
    error: Optional[str] = None  # the check itself crashed
    incomplete: list[str] = field(default_factory=list)  # probes that failed, leaving it partly blind
    # Its findings are symptoms of another check's root finding, listed there as consequences: the
    # status stays "pass" (they never count), renderers show a consequence mark instead of a pass.
    consequence_of: Optional[str] = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "status": self.status, "summary": self.summary}
        if self.error:
            out["error"] = self.error
        if self.incomplete:
            out["incomplete"] = self.incomplete
        if self.consequence_of:
            out["consequence_of"] = self.consequence_of
        return out

    @classmethod
    def from_json(cls, data: dict) -> "CheckStatus":
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
    outcome: str  # completed | failed | hung | timeout | interrupted
    duration_s: float
    launch_mode: str
    checks: list[CheckStatus] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    ranks: list[dict] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    probe_errors: list[dict] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    torch_version: str = ""
    python_version: str = ""
    cut: Optional[dict] = None  # {"reason": "max-steps"|"max-epochs", "at": N}: a bounded run stopped on purpose
    suppressed: list[dict] = field(default_factory=list)  # [{"finding", "reason", "file", "line"}]
    unused_suppressions: list[dict] = field(default_factory=list)  # [{"file", "line", "checks", "reason"}]
    role: str = "report"  # "peer": a non-zero rank of an existing launch; rank 0 holds the report
    peer_exit_code: int = 0
    environment: list[dict] = field(default_factory=list)  # per rank: versions, GPUs, variables (analysis/environment.py)
    collective_benchmark: Optional[dict] = None  # the reference job's collective sweep (analysis/bandwidth.py)
    device_simulation: Optional[dict] = None  # {"mode", "active", "simulated", "calls", "unsupported", ...}
    # outcome "interrupted": {"signal", "exit_code" (128+N), "rank" (whose ddpdoctor got it; None: the
    # reporting one), "during" ("start-up" before any rank ran the script, else "run"), "left_out"
    # (what the stop cut off, not judged), "ranks" (where each rank was)}
    interruption: Optional[dict] = None
    launch: dict = field(default_factory=dict)  # how the ranks were launched (Observations.launch): mode, detection, Slurm job
    sources: dict = field(default_factory=dict)  # file -> {line: text} the findings point at (render/source.py)
    timeline: Optional[dict] = None  # per-rank steps, collectives, stalls, exits (analysis/timeline.py)
    launcher_log: list[str] = field(default_factory=list)  # torchrun's own log lines, kept off the screen
    launcher_log_path: Optional[str] = None  # where the CLI wrote them
    framework: Optional[dict] = None  # {"name", "title", "version"}: the framework that built DDP (Accelerate, Lightning)
    post_mortem: Optional[dict] = None  # `ddpdoctor analyze`: {"dumps", "error_files", "logs", "formats", "notes", ...}
    # {"reason", "ranks"}: ddpdoctor could not check the job (its probes did not install): no finding, exit 2
    unchecked: Optional[dict] = None

    def at_or_above(self, level: str) -> list[Finding]:
        threshold = SEVERITY_ORDER[level]
        return [f for f in self.findings if SEVERITY_ORDER[f.severity] >= threshold]

    def exit_code(self, fail_on: str = "warning") -> int:
        """0 when no top-level finding reaches ``fail_on``, else 1 (design.md's exit-code contract);
        128+N when signal N interrupted the run, whatever was found before it; 2 when the probes could
        not install, so nothing was checked."""
        if self.role == "peer":
            return self.peer_exit_code
        if self.outcome == "interrupted" and self.interruption:
            return int(self.interruption.get("exit_code") or 130)
        if self.unchecked:
            return 2  # ddpdoctor could not do its job: not a verdict on the script
        return 1 if self.at_or_above(fail_on) else 0

    def assert_clean(self, fail_on: str = "warning") -> None:
        """For tests: raise AssertionError listing every top-level finding at or above ``fail_on``
        (where, what, the fix), so a test fails the way ``--fail-on`` fails a run."""
        __tracebackhide__ = True  # pytest shows the caller's line, not this method's body
        if self.outcome == "interrupted":  # not clean: it did not finish
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

    def to_json(self) -> dict:
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
        }

    @classmethod
    def from_json(cls, data: dict) -> "Report":
        """A report saved with ``--json``, back as a Report: CI renders JUnit, SARIF or Markdown from
        it without rerunning the job. Keys this version does not know are ignored."""
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report (schema {data.get('schema')!r})")
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
        )


def _backend_and_device(evidence: Evidence) -> tuple[str, str]:
    """What the ranks ran on. A post-mortem's files may not say (error files name no backend, dumps no
    device): "unknown" then, never a default that reads as a fact."""
    backends = sorted({e.backend for _, e in evidence.events(InitProcessGroup) if e.backend})
    devices = sorted({e.device.split(":")[0] for _, e in evidence.events(DDPWrap) if e.device})
    unknown = "unknown" if evidence.post_mortem else None
    return ",".join(backends) or unknown or "none", ",".join(devices) or unknown or "cpu"


def device_simulation(evidence: Evidence) -> Optional[dict]:
    """What the ranks' device simulation stood in for (the last, cumulative event of each process),
    None for evidence without any (written before simulation existed)."""
    last: dict[int, DeviceSimulation] = {}
    for rank, event in evidence.events(DeviceSimulation):
        last[rank] = event
    unranked = [e for e in evidence.unranked if isinstance(e, DeviceSimulation)]
    for event in unranked:  # an mp.spawn launcher (its device_count() started the workers), a worker that died early
        last[-1 - unranked.index(event)] = event
    if not last:
        return None
    calls: dict[str, int] = {}
    unsupported: list[str] = []
    ignored: list[str] = []
    for event in last.values():
        for name, n in event.calls.items():
            calls[name] = calls.get(name, 0) + int(n)
        unsupported += [u for u in event.unsupported if u not in unsupported]
        ignored += [u for u in event.ignored if u not in ignored]
    events = list(last.values())
    reasons = list(dict.fromkeys(e.reason for e in events if e.reason))
    return {"mode": events[0].mode, "active": any(e.active for e in events),
            "ranks": sorted(r for r, e in last.items() if e.active and r >= 0),
            "simulated": sorted(calls), "calls": dict(sorted(calls.items())), "unsupported": unsupported,
            "ignored": ignored, "reason": "; ".join(reasons)}


FRAMEWORK_TITLES = {"transformers": "Hugging Face Trainer", "accelerate": "Accelerate", "lightning": "Lightning Trainer",
                    "fabric": "Lightning Fabric"}


def framework_of(evidence: Evidence) -> Optional[dict]:
    """The framework that set DDP up, as the report names it."""
    found = evidence.facts.framework
    if found is None:
        return None
    return {"name": found[0], "title": FRAMEWORK_TITLES.get(found[0], found[0]), "version": found[1]}


def device_simulation_line(simulation: Optional[dict]) -> Optional[str]:
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


def build_report(evidence: Evidence, analysis: Analysis, *, version: str, script: Optional[str], argv: list[str],
                 duration_s: float) -> Report:
    # Unprobed ranks recorded no process group or model: what they ran on is unknown, not "none".
    backend, device = ("unknown", "unknown") if analysis.unchecked else _backend_and_device(evidence)
    observations = evidence.observations
    starts = [e for _, e in evidence.events(ProcessStart)] + [e for e in evidence.unranked if isinstance(e, ProcessStart)]
    environments = [e for _, e in evidence.events(RankEnvironment)]  # the version, where torch came after the start
    shown = [f.to_json() for f in analysis.findings] + [f.to_json() for f, _ in analysis.suppressed]
    return Report(
        sources=collect_sources(shown), timeline=build_timeline(evidence),
        launcher_log=list(observations.launcher_log),
        torch_version=next((e.torch_version for e in [*starts, *environments] if e.torch_version), ""),
        python_version=next((e.python_version for e in starts if e.python_version), ""),
        version=version, script=script, argv=argv, world_size=evidence.world_size, nnodes=evidence.nnodes,
        backend=backend, device=device, outcome=evidence.outcome, duration_s=duration_s,
        launch_mode=observations.launch_mode,
        checks=[CheckStatus(id=o.id, title=o.title, status=o.status, summary=o.summary, error=o.error,
                            incomplete=o.incomplete, consequence_of=o.consequence_of) for o in analysis.outcomes],
        findings=analysis.findings,
        ranks=[{"rank": r, "host": ev.host, "node": ev.node_rank, "local_rank": ev.local_rank, "pid": ev.pid}
               for r, ev in sorted(evidence.ranks.items())],
        nodes=sorted({ev.node_rank for ev in evidence.ranks.values() if ev.node_rank is not None}),
        probe_errors=analysis.probe_errors,
        missing_ranks=observations.missing_ranks,
        cut={"reason": evidence.facts.cut.reason, "at": evidence.facts.cut.at} if evidence.facts.cut else None,
        suppressed=[{"finding": f.to_json(), "reason": s.reason, "file": s.file, "line": s.line}
                    for f, s in analysis.suppressed],
        unused_suppressions=[s.to_json() for s in analysis.unused_suppressions],
        environment=rank_environments(evidence),
        collective_benchmark=collective_benchmark(evidence),
        device_simulation=device_simulation(evidence),
        interruption=interruption_of(evidence, analysis),
        launch=observations.launch,
        framework=framework_of(evidence),
        unchecked=analysis.unchecked,
    )


def interruption_of(evidence: Evidence, analysis: Analysis) -> Optional[dict]:
    """The report's account of a stop signal: which, whose, when, what it cut off, where each rank was."""
    stop = evidence.stop
    if evidence.outcome != "interrupted" or stop is None:
        return None
    try:
        number = int(signal.Signals[stop.signal or ""])
    except KeyError:
        number = int(signal.SIGTERM)
    ranks = {}
    for rank, state in sorted(stop.ranks.items()):
        user = [f for f in state.stack if f.get("user")]
        beat = state.heartbeat
        ranks[str(rank)] = {"state": state.state, "waiting_in": state.waiting_in, "stalled_s": state.stalled_s,
                            "steps": beat.steps if beat else None,
                            "last_collective": beat.last_collective if beat else None,
                            "where": user[-1] if user else None}
    left_out = analysis.left_out
    return {"signal": stop.signal, "exit_code": 128 + number, "rank": stop.signal_rank,
            "during": "run" if any(ev.events for ev in evidence.ranks.values()) or evidence.unranked else "start-up",
            "left_out": left_out.to_json() if left_out else None,
            "left_out_summary": interruption.summary(left_out) if left_out else "",
            "ranks": ranks}


def write_json(report: Report, path: str) -> None:
    """Write atomically so CI never reads a half-written report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(report.to_json(), f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)
