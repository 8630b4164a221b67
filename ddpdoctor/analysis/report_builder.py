"""The report of one run, built from its evidence and the checks' results (:class:`Analysis`): the
model is :mod:`ddpdoctor.analysis.report`; this fills it, deriving what the renderers show beside the
findings (backend and device, environments, the collective benchmark, device simulation, the
framework, an interruption's account, the timeline, the source lines the findings point at).
"""

from __future__ import annotations

import signal
from typing import Any, Optional, Union

from ddpdoctor.analysis import interruption
from ddpdoctor.analysis.bandwidth import collective_benchmark
from ddpdoctor.analysis.parallelism import parallelism
from ddpdoctor.analysis.rank_environments import rank_environments
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.facts import ddp
from ddpdoctor.analysis.render.source import collect_sources
from ddpdoctor.analysis.report import CheckStatus, Report
from ddpdoctor.analysis.runner import Analysis
from ddpdoctor.analysis.timeline import build_timeline
from ddpdoctor.schema.events import (DDPWrap, DeviceSimulation, InitProcessGroup, ProcessStart, RankEnvironment,
                                     RunCut)
from ddpdoctor.schema.observations import Outcome

__all__ = ["build_report", "device_simulation", "framework_of", "interruption_of", "FRAMEWORK_TITLES"]


def _backend_and_device(evidence: Evidence) -> tuple[str, str]:
    """What the ranks ran on. A post-mortem's files may not say (error files name no backend, dumps no
    device): "unknown" then, never a default that reads as a fact."""
    backends = sorted({e.backend for _, e in evidence.events(InitProcessGroup) if e.backend})
    devices = sorted({e.device.split(":")[0] for _, e in evidence.events(DDPWrap) if e.device})
    unknown = "unknown" if evidence.post_mortem else None
    return ",".join(backends) or unknown or "none", ",".join(devices) or unknown or "cpu"


def device_simulation(evidence: Evidence) -> Optional[dict[str, Any]]:
    """What the ranks' device simulation stood in for (the last, cumulative event of each process),
    None for evidence without any (written before simulation existed)."""
    last: dict[int, DeviceSimulation] = {}
    for rank, event in evidence.events(DeviceSimulation):
        last[rank] = event
    unranked = [e for e in evidence.unranked if isinstance(e, DeviceSimulation)]
    # an mp.spawn launcher (its device_count() started the workers), a worker that died early
    for event in unranked:
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


FRAMEWORK_TITLES = {"transformers": "Hugging Face Trainer", "accelerate": "Accelerate",
                    "lightning": "Lightning Trainer", "fabric": "Lightning Fabric"}


def framework_of(evidence: Evidence) -> Optional[dict[str, Any]]:
    """The framework that set DDP up, as the report names it."""
    found = ddp.framework(evidence)
    if found is None:
        return None
    return {"name": found[0], "title": FRAMEWORK_TITLES.get(found[0], found[0]), "version": found[1]}


def cut_of(evidence: Evidence) -> Optional[dict[str, Any]]:
    """Where ddpdoctor stopped a bounded run on purpose (--max-steps/--max-epochs), if it did."""
    cut = next((e for _, e in evidence.events(RunCut)), None)
    return {"reason": cut.reason, "at": cut.at} if cut else None


def build_report(evidence: Evidence, analysis: Analysis, *, version: str, script: Optional[str], argv: list[str],
                 duration_s: float) -> Report:
    # Unprobed ranks recorded no process group or model: what they ran on is unknown, not "none".
    backend, device = ("unknown", "unknown") if analysis.unchecked else _backend_and_device(evidence)
    observations = evidence.observations
    starts = ([e for _, e in evidence.events(ProcessStart)]
              + [e for e in evidence.unranked if isinstance(e, ProcessStart)])
    environments = [e for _, e in evidence.events(RankEnvironment)]  # the version, where torch came after the start
    versioned: list[Union[ProcessStart, RankEnvironment]] = [*starts, *environments]
    shown = [f.to_json() for f in analysis.findings] + [f.to_json() for f, _ in analysis.suppressed]
    return Report(
        sources=collect_sources(shown), timeline=build_timeline(evidence),
        launcher_log=list(observations.launcher_log),
        torch_version=next((e.torch_version for e in versioned if e.torch_version), ""),
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
        cut=cut_of(evidence),
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
        parallelism=None if analysis.unchecked else parallelism(evidence),
    )


def interruption_of(evidence: Evidence, analysis: Analysis) -> Optional[dict[str, Any]]:
    """The report's account of a stop signal: which, whose, when, what it cut off, where each rank was."""
    stop = evidence.stop
    if evidence.outcome != Outcome.INTERRUPTED or stop is None:
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
