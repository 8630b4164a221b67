"""The supervisor: starts the ranks, watches heartbeats and output, enforces hang and timeout
policy, stops everything it started, and hands the evidence to the analyzers.

It never imports torch: it must stay responsive while ranks hang, and start fast.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ddpdoctor import envvars, processes
from ddpdoctor.evidence import Evidence, load_dir
from ddpdoctor.hang import HangDetector, build_snapshot, is_waiting
from ddpdoctor.launch import LaunchPlan, RunConfig
from ddpdoctor.watchdog import DUMP_REQUEST

_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:(.*)$", re.S)
STACK_WAIT_S = 2.0
STOP_GRACE_S = 2.0
POLL_S = 0.5  # heartbeats are written every 0.5 s
TRACK_S = 2.0


class Display(Protocol):
    def output(self, rank: Optional[int], line: str) -> None: ...
    def update(self, heartbeats: dict[int, dict], now: float) -> None: ...
    def notice(self, text: str) -> None: ...


@dataclass
class RunResult:
    evidence: Evidence
    duration_s: float
    mode: str


@dataclass
class _Job:
    plan: LaunchPlan
    procs: list[subprocess.Popen] = field(default_factory=list)
    lines: "queue.Queue[tuple[int, str]]" = field(default_factory=queue.Queue)
    pumps: list[threading.Thread] = field(default_factory=list)
    known_pids: dict[int, Optional[int]] = field(default_factory=dict)


class Supervisor:
    def __init__(self, config: RunConfig, plan: LaunchPlan, evidence_dir: str, display: Display) -> None:
        self.config = config
        self.plan = plan
        self.evidence_dir = evidence_dir
        self.display = display
        self.detector = HangDetector(fixed_timeout_s=config.hang_timeout_s)
        self._signal: Optional[int] = None
        self._rank_of: dict[tuple[int, int], int] = {}

    # -- process management -------------------------------------------------------------------
    def _start(self) -> _Job:
        job = _Job(plan=self.plan)
        for index, command in enumerate(self.plan.commands):
            env = dict(self.plan.env)
            env[envvars.AGENT] = str(index)
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            job.procs.append(proc)
            job.known_pids[proc.pid] = None
            pump = threading.Thread(target=_pump, args=(proc, index, job.lines), daemon=True)
            pump.start()
            job.pumps.append(pump)
        return job

    def _track_descendants(self, job: _Job) -> None:
        for proc in job.procs:
            job.known_pids.update(processes.descendants(proc.pid))

    def _stop(self, job: _Job) -> None:
        """Stop agents and every process under them; nothing may survive."""
        self._track_descendants(job)
        targets = {pid: start for pid, start in job.known_pids.items()}
        processes.stop_all(targets, grace_s=STOP_GRACE_S)
        for proc in job.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()

    # -- heartbeats and stacks ------------------------------------------------------------------
    def _heartbeats(self) -> dict[int, dict]:
        beats: dict[int, dict] = {}
        for name in os.listdir(self.evidence_dir):
            if name.startswith("hb-") and name.endswith(".json"):
                beat = _read_json(os.path.join(self.evidence_dir, name))
                if beat and beat.get("rank") is not None:
                    if beat.get("agent") is not None and beat.get("local_rank") is not None:
                        self._rank_of[(beat["agent"], beat["local_rank"])] = beat["rank"]
                    previous = beats.get(beat["rank"])
                    if previous is None or beat.get("t", 0) >= previous.get("t", 0):
                        beats[beat["rank"]] = beat
        return beats

    def _request_stacks(self, live: dict[int, dict]) -> dict[int, dict]:
        token = uuid.uuid4().hex
        path = os.path.join(self.evidence_dir, DUMP_REQUEST)
        with open(path + ".tmp", "w") as f:
            f.write(token)
        os.replace(path + ".tmp", path)
        deadline = time.monotonic() + STACK_WAIT_S
        stacks: dict[int, dict] = {}
        while time.monotonic() < deadline:
            for rank, beat in live.items():
                dump = _read_json(os.path.join(self.evidence_dir, f"stack-{beat['pid']}.json"))
                if dump and dump.get("token") == token:
                    stacks[rank] = dump
            if len(stacks) == len(live):
                break
            time.sleep(0.05)
        return stacks

    # -- main loop ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        started = time.monotonic()
        previous_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        job = self._start()
        outcome, hang, interrupted = "completed", None, False
        last_poll = last_tracked = 0.0
        try:
            while True:
                self._drain(job)
                now = time.monotonic()
                if all(p.poll() is not None for p in job.procs):
                    break
                if now - last_poll < POLL_S:
                    time.sleep(0.05)
                    continue
                last_poll = now
                if now - last_tracked > TRACK_S:  # a /proc scan: cheap, but the ranks share the CPUs
                    self._track_descendants(job)
                    last_tracked = now
                beats = self._heartbeats()
                for rank, beat in beats.items():
                    self.detector.observe(now, rank, beat.get("progress", 0), beat.get("steps", 0))
                self.display.update(beats, time.time())
                live = {r: b for r, b in beats.items() if b.get("activity") != "exited" and processes.alive(b["pid"])}
                if self._signal is not None:
                    interrupted = True
                    self.display.notice(f"received {signal.Signals(self._signal).name}: stopping every rank")
                    hang = self._snapshot(beats, live, now, reason="interrupted")
                    hang["signal"] = signal.Signals(self._signal).name
                    break
                if self.config.timeout_s is not None and now - started > self.config.timeout_s:
                    outcome = "timeout"
                    self.display.notice(f"--timeout {self.config.timeout_s:g}s expired: stopping every rank")
                    hang = self._snapshot(beats, live, now, reason="timeout")
                    break
                stalled = self.detector.stalled(now, set(live))
                if stalled:
                    snapshot = self._snapshot(beats, live, now, reason="hang")
                    stacks = snapshot["stacks"]
                    if any(is_waiting(stacks.get(str(r), {}).get("stack", [])) for r in stalled):
                        outcome, hang = "hung", snapshot
                        self.display.notice(
                            f"no progress on ranks {', '.join(map(str, stalled))} for "
                            f"{self.detector.threshold_s():g}s: collecting stacks and stopping the job")
                        break
                    for r in stalled:
                        self.detector.reset(r, now)
        finally:
            self._stop(job)
            for pump in job.pumps:
                pump.join(timeout=2)
            self._drain(job)
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        exit_codes = [p.returncode for p in job.procs]
        if outcome == "completed" and (interrupted or any(c != 0 for c in exit_codes)):
            outcome = "failed"
        evidence = load_dir(
            self.evidence_dir,
            world_size=self.config.nproc_per_node * self.config.nnodes if self.plan.mode == "torchrun" else 0,
            nnodes=self.config.nnodes,
            outcome=outcome,
            script=self.config.script,
            failures=self._failures(),
            hang=hang,
            timeout_s=self.config.timeout_s,
            interrupted=interrupted,
        )
        return RunResult(evidence=evidence, duration_s=time.monotonic() - started, mode=self.plan.mode)

    def _snapshot(self, beats: dict[int, dict], live: dict[int, dict], now: float, *, reason: str) -> dict:
        stacks = self._request_stacks(live) if live else {}
        return build_snapshot(reason=reason, detector=self.detector, now=now, heartbeats=beats,
                              live=set(live), stacks=stacks)

    def _failures(self) -> list[dict]:
        failures = []
        for path in self.plan.agent_outputs:
            data = _read_json(path)
            if data:
                failures.extend(data.get("failures", []))
        return failures

    def _on_signal(self, signum: int, frame) -> None:
        if self._signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for stacks, clean up now
        self._signal = signum

    def _drain(self, job: _Job) -> None:
        while True:
            try:
                agent, line = job.lines.get_nowait()
            except queue.Empty:
                return
            match = _RANK_PREFIX.match(line)
            if match:
                local = int(match.group(1))
                rank = self._rank_of.get((agent, local), agent * self.config.nproc_per_node + local)
                self.display.output(rank, match.group(2))
            else:
                self.display.output(None, line)


def _pump(proc: subprocess.Popen, agent: int, lines: "queue.Queue[tuple[int, str]]") -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        lines.put((agent, raw.decode("utf-8", errors="replace").rstrip("\n")))
    proc.stdout.close()


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
