"""``run(config) -> Report``: the one pipeline behind every launch mode.

plan -> start the processes -> monitor (heartbeats, hang / timeout / interrupt) -> stop every
process -> collect the evidence through the transport -> analyze -> report. It never exits the
interpreter and leaves nothing behind (no processes, no temporary files, no signal handlers), so
Python code can call it; the CLI is one such caller. It and the CLI are the supervisor side's
composition points, the only modules here that reach into the analysis side.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Optional

from ddpdoctor._version import __version__
from ddpdoctor.schema import settings
from ddpdoctor.schema.observations import Failure, Observations, OneRankReplay, Outcome, StopSnapshot
from ddpdoctor.supervisor import launch, one_rank
from ddpdoctor.supervisor.config import RunConfig
from ddpdoctor.supervisor.display import Display, NullDisplay
from ddpdoctor.supervisor.jobs import SubprocessJob
from ddpdoctor.supervisor.monitor import Monitor, MonitorResult
from ddpdoctor.supervisor.node import NodeDir
from ddpdoctor.supervisor.job_output import OutputRouter
from ddpdoctor.supervisor.signals import StopSignals, exit_code_for, signal_number
from ddpdoctor.supervisor.transport import Collected, FileTransport, read_json

if TYPE_CHECKING:
    from ddpdoctor.analysis.evidence import Evidence
    from ddpdoctor.analysis.report import Report

__all__ = ["run", "NoEvidence"]


class NoEvidence(RuntimeError):
    """The job produced no evidence at all: torchrun or the bootstrap could not start."""


def run(config: RunConfig, *, display: Optional[Display] = None) -> "Report":
    """Run the job ``config`` describes under ddpdoctor's probes and return the report.

    A stop signal (Ctrl-C, SIGTERM, a scheduler's) at any point before the job ends, start-up
    included, stops every rank and returns a report with outcome "interrupted" (signals.py)."""
    display = display or NullDisplay()
    with StopSignals() as signals:
        return _run(config, display, signals)


def _run(config: RunConfig, display: Display, signals: StopSignals) -> "Report":
    script = config.script_path()
    started = time.monotonic()
    existing = launch.existing_launch()
    if existing is not None:
        return _run_in_existing_launch(config, existing, script, display, started, signals)
    evidence_dir = tempfile.mkdtemp(prefix="ddpdoctor-")
    replay_dir = tempfile.mkdtemp(prefix="ddpdoctor-one-rank-") if config.against_one_rank and not \
        one_rank.unsupported(config, launch.choose_mode(config, script)) else None
    try:
        plan = launch.build_plan(one_rank.recording(config, replay_dir) if replay_dir else config, script,
                                 evidence_dir)
        job = SubprocessJob(plan.commands, plan.env, env_per_command=plan.env_per_command)
        router = OutputRouter(display, nproc_per_node=config.nproc_per_node)
        transport = FileTransport(evidence_dir)
        monitor = Monitor(transport=transport, display=display, router=router, hang_timeout_s=config.hang_timeout_s,
                          timeout_s=config.timeout_s, world_size=plan.world_size, signals=signals)
        job.start()
        try:
            _preload_analysis()
            result = monitor.watch(job)
        finally:
            job.stop()
            router.route(job.drain())
        relaunch = _relaunch_request(plan, evidence_dir)
        if relaunch is not None and result.stop is None:
            display.notice(f"{relaunch}; starting it again under torchrun")
            return _run(dataclasses.replace(config, launch="torchrun", launch_note=relaunch), display, signals)
        collected = transport.collect()
        collected.failures = _agent_failures(plan.agent_outputs)
        collected.output_tails = router.tail_lists()
        collected.launcher_log = router.launcher_lines()
        _keep_evidence(config, evidence_dir)
        failed = any(code != 0 for code in job.exit_codes)
        replayed = _replay(config, plan, script, replay_dir, result, display, signals)
        return _report(config, plan, script, collected, result, failed=failed, started=started, one=replayed)
    finally:
        shutil.rmtree(evidence_dir, ignore_errors=True)
        if replay_dir:
            shutil.rmtree(replay_dir, ignore_errors=True)


def _replay(config: RunConfig, plan: launch.LaunchPlan, script: str, replay_dir: Optional[str],
            result: MonitorResult, display: Display, signals: StopSignals) -> Optional[OneRankReplay]:
    """--against-one-rank's replay, after a run that ended by itself; None when not asked for."""
    if not config.against_one_rank:
        return None
    refused = one_rank.unsupported(config, plan.mode)
    if refused or replay_dir is None:
        return OneRankReplay(world_size=plan.world_size, steps_requested=config.against_one_rank, error=refused)
    if result.stop is not None:
        return OneRankReplay(world_size=plan.world_size, steps_requested=config.against_one_rank,
                             error=f"the run did not end by itself ({result.stop.reason}), so it was not replayed")
    return one_rank.replay(config, script, replay_dir, display=display, signals=signals, world_size=plan.world_size)


def _run_in_existing_launch(config: RunConfig, existing: launch.ExistingLaunch, script: str, display: Display,
                            started: float, signals: StopSignals) -> "Report":
    from ddpdoctor.supervisor import existing as ranks

    node = ranks.evidence_directory(existing)
    try:
        plan = launch.build_plan(config, script, node.directory, existing=existing)
        run = ranks.run_rank(plan, node, display=display, signals=signals, hang_timeout_s=config.hang_timeout_s,
                             timeout_s=config.timeout_s)
    except BaseException:
        if not node.shared:
            NodeDir(node.directory).remove()
        raise
    if existing.rank != 0:
        from ddpdoctor.analysis.report import Report

        # Once rank 0 holds this rank's evidence, its report and exit code speak for the whole job;
        # exiting 0 here keeps a launcher from stopping rank 0 while it writes the report. A stop
        # signal makes every task exit 128+signal, so a scheduler sees each one interrupted.
        stop = run.result.stop
        if stop is not None and stop.reason == "interrupted":
            outcome, exit_code = Outcome.INTERRUPTED, exit_code_for(signal_number(stop.signal or "") or 15)
        else:
            outcome = Outcome.COMPLETED if run.exit_code == 0 else Outcome.FAILED
            exit_code = 0 if run.reported else run.exit_code
        return Report(version=__version__, script=None if config.is_reference else script,
                      argv=list(config.script_args), world_size=existing.world_size, nnodes=existing.nnodes,
                      backend="", device="", outcome=outcome, duration_s=time.monotonic() - started,
                      launch_mode=plan.mode, role="peer", peer_exit_code=exit_code)
    assert run.collected is not None
    _keep_evidence(config, node.directory, run.collected)
    try:
        return _report(config, plan, script, run.collected, run.result,
                       failed=bool(run.collected.failures or run.collected.missing_ranks), started=started,
                       one=_replay(config, plan, script, None, run.result, display, signals))
    finally:
        ranks.finish_rank_zero(run, node)  # after the report is built: the caller renders and writes it at once


def _relaunch_request(plan: launch.LaunchPlan, evidence_dir: str) -> Optional[str]:
    """Why a spawn-mode launcher (guessed from the script's source) asked for torchrun, or None."""
    if plan.mode != "spawn":
        return None
    data = read_json(os.path.join(evidence_dir, settings.RELAUNCH_UNDER_TORCHRUN))
    if data is None:
        return None
    site = (data.get("site") or [{}])[0]
    where = f" at {os.path.basename(site['file'])}:{site['line']}" if site.get("file") else ""
    return (f"the script calls mp.spawn in some runs, but in this one it set up its process group from torchrun's "
            f"environment{where}")


def _preload_analysis() -> None:
    """Import the analysis side and the built-in checks (about 0.1 s) while torchrun's agent imports
    torch and a core is idle, instead of after the job, where they add to the time to the verdict."""
    try:
        import ddpdoctor.analysis.evidence
        import ddpdoctor.analysis.report_builder
        import ddpdoctor.analysis.runner
        import ddpdoctor.analysis.suppression  # noqa: F401
        from ddpdoctor.analysis.registry import load_checks

        load_checks()  # a plugin that fails to load is reported with the checks, as it would be without this
    except Exception:
        pass  # the same import after the job raises it where it is reported


def _report(config: RunConfig, plan: launch.LaunchPlan, script: str, collected: Collected, result: MonitorResult, *,
            failed: bool, started: float, one: Optional[OneRankReplay] = None) -> "Report":
    interrupted = result.stop is not None and result.stop.reason == "interrupted"
    if not any(collected.processes) and not interrupted:  # stopped during start-up: still a report, "interrupted"
        raise NoEvidence("the job produced no evidence: torchrun or the bootstrap failed to start (see output above)")
    observations = Observations(
        outcome=_outcome(result.stop, failed=failed), world_size=plan.world_size, nnodes=_nnodes(config, plan),
        launch_mode=plan.mode, launch=_launch_info(plan, config.launch_note), failures=collected.failures,
        stop=result.stop,
        timeout_s=config.timeout_s,
        output_tails=collected.output_tails, missing_ranks=collected.missing_ranks, stalls=result.stalls,
        min_busbw_gbps=config.min_busbw_gbps, launcher_log=collected.launcher_log, one_rank=one)
    from ddpdoctor.analysis.evidence import Evidence, no_cyclic_gc, parse_lines  # the analysis side: rank 0 only
    from ddpdoctor.analysis.report_builder import build_report
    from ddpdoctor.analysis.runner import analyze
    from ddpdoctor.analysis.suppression import scan_files

    checks = config.checks()  # first: plugins register their event kinds before the evidence is read
    pool: dict[str, str] = {}  # one copy of the fingerprints replicas share
    with no_cyclic_gc():
        evidence = Evidence.from_processes((parse_lines(lines, pool) for lines in collected.processes),
                                           observations=observations, script=script)
        suppressions = scan_files(_source_files(evidence, script))
        analysis = analyze(evidence, checks, suppressions=suppressions)
        report = build_report(evidence, analysis, version=__version__,
                              script=None if config.is_reference else script, argv=list(config.script_args),
                              duration_s=time.monotonic() - started)
    _capture_analysis_input(config, collected, observations, script, checks, suppressions, report)
    return report


def _capture_analysis_input(config: RunConfig, collected: Collected, observations: Observations, script: str,
                            checks: list, suppressions: list, report: "Report") -> None:
    """DDPDOCTOR_CAPTURE_DIR: write what the analysis read (every process's evidence lines, the
    observations, the checks, the suppressions) beside the JSON report it gave, so the analysis can be
    replayed offline on exactly this input (tests/unit/test_golden_reports.py replays the fixtures')."""
    directory = os.environ.get(settings.CAPTURE_DIR)
    if not directory:
        return
    import gzip
    import json

    record = {"processes": collected.processes, "observations": observations.to_json(), "script": script,
              "is_reference": config.is_reference, "argv": list(config.script_args),
              "checks": [c.id for c in checks], "suppressions": [s.to_json() for s in suppressions],
              "report": report.to_json()}
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{os.path.basename(script)}-{os.getpid()}-{time.monotonic_ns()}.json.gz")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(record, f)


def _source_files(evidence: "Evidence", script: str) -> set[str]:
    """The user's files findings can point at: the script and every file in a recorded call site."""
    files = {script}
    for ev in evidence.ranks.values():
        for event in ev.events:
            for frame in getattr(event, "site", None) or []:
                files.add(frame.get("file", ""))
            location = getattr(event, "location", None)
            if isinstance(location, dict) and location.get("file"):
                files.add(location["file"])
    return {f for f in files if f and not f.startswith("<")}


def _outcome(stop: Optional[StopSnapshot], *, failed: bool) -> Outcome:
    if stop is None:
        return Outcome.FAILED if failed else Outcome.COMPLETED
    return {"hang": Outcome.HUNG, "no-progress": Outcome.HUNG, "timeout": Outcome.TIMEOUT,
            "interrupted": Outcome.INTERRUPTED}.get(stop.reason, Outcome.FAILED)


def _nnodes(config: RunConfig, plan: launch.LaunchPlan) -> int:
    return plan.existing.nnodes if plan.existing is not None else config.nnodes


def _launch_info(plan: launch.LaunchPlan, note: str = "") -> dict:
    """For the report: the mode, how an existing launch was detected, and the cluster job."""
    info: dict = {"mode": plan.mode}
    if note:
        info["detected"] = note
    if plan.existing is not None:
        info["detected"] = plan.existing.detected
        info["exported"] = sorted(plan.existing.exported)
    if plan.scheduler is not None:
        info["scheduler"] = plan.scheduler
    return info


def _agent_failures(paths: list[str]) -> list[Failure]:
    failures = []
    for path in paths:
        data = read_json(path)
        if data:
            failures.extend(Failure.from_json(f) for f in data.get("failures", []))
    return failures


def _keep_evidence(config: RunConfig, evidence_dir: str, collected: Optional[Collected] = None) -> None:
    """--keep-evidence: copy the raw per-process evidence (gathered from every rank in a launch)."""
    if config.keep_evidence is None:
        return
    os.makedirs(config.keep_evidence, exist_ok=True)
    if collected is None:
        shutil.copytree(evidence_dir, config.keep_evidence, dirs_exist_ok=True)
        return
    for index, lines in enumerate(collected.processes):
        with open(os.path.join(config.keep_evidence, f"events-gathered{index}.jsonl"), "w") as f:
            f.write("\n".join(lines) + ("\n" if lines else ""))
