"""Launch mode 2: ddpdoctor runs inside an existing torchrun/srun launch, one copy per rank.

Every rank installs the probes and runs the script in-process. Ranks talk through a c10d TCPStore,
so no shared filesystem is needed: torchrun's agent store when there is one, otherwise a store
hosted by rank 0 on MASTER_PORT+1 (DDPDOCTOR_STORE_PORT overrides). Each rank's watchdog publishes
its heartbeat there and answers stack-dump requests; rank 0 also watches for hangs, exactly as the
supervisor does in the other modes. At the end every rank sends its events; rank 0 analyzes and
reports, and the other ranks exit with the script's own status.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import threading
import time
import traceback
import uuid
import zlib
from datetime import timedelta
from typing import Optional

from ddpdoctor import envvars
from ddpdoctor.hang import HangDetector, build_snapshot, is_waiting
from ddpdoctor.recorder import Recorder
from ddpdoctor.watchdog import Watchdog

GATHER_WAIT_S = 60.0
STACK_WAIT_S = 3.0
STALE_HEARTBEAT_S = 10.0


def inside_existing_launch() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and envvars.ACTIVE not in os.environ


def _connect(rank: int, world_size: int, *, host: bool):
    """A client of the job's store (or, on rank 0 without torchrun's agent store, the server)."""
    from torch.distributed import PrefixStore, TCPStore

    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=GATHER_WAIT_S)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = TCPStore(address, int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    else:
        port = int(os.environ.get("DDPDOCTOR_STORE_PORT") or int(os.environ.get("MASTER_PORT", "29500")) + 1)
        store = TCPStore(address, port, world_size, is_master=host and rank == 0, timeout=timeout,
                         wait_for_workers=False)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or "default"
    return PrefixStore(f"ddpdoctor/{run_id}/", store)


def _local_events(evidence_dir: str) -> bytes:
    chunks = []
    for path in sorted(glob.glob(os.path.join(evidence_dir, "events-*.jsonl"))):
        with open(path, "rb") as f:
            chunks.append(f.read())
    return zlib.compress(b"".join(chunks))


class StoreWatchdog(Watchdog):
    """The rank watchdog speaking through the store: heartbeats, stack dumps, abort."""

    def __init__(self, rec: Recorder, store, rank: int) -> None:
        super().__init__(rec)
        self.store = store
        self.rank = rank

    def tick(self) -> None:
        try:
            self.store.set(f"hb/{self.rank}", json.dumps(self.rec.heartbeat(), default=str))
            if self.store.check(["dump"]):
                payload = self.dump(self.store.get("dump").decode())
                if payload is not None:
                    self.store.set(f"events/{self.rank}", _local_events(self.rec.evidence_dir))
                    self.store.set(f"stack/{self.rank}", json.dumps(payload, default=str))
            if self.rank != 0 and self.store.check(["abort"]):
                os._exit(1)  # rank 0 reported a hang and stops the job
        except Exception:  # the store went away: the job is ending
            pass

    def _beat(self) -> None:
        self.tick()


class HangMonitor(threading.Thread):
    """On rank 0: the supervisor's hang and timeout policy, over the store."""

    def __init__(self, store, world_size: int, config, on_stop) -> None:
        super().__init__(name="ddpdoctor-hang-monitor", daemon=True)
        self.store = store
        self.world_size = world_size
        self.config = config
        self.on_stop = on_stop
        self.detector = HangDetector(fixed_timeout_s=config.hang_timeout_s)
        self.started = time.monotonic()
        self.done = threading.Event()

    def _beats(self) -> dict[int, dict]:
        keys = [f"hb/{r}" for r in range(self.world_size)]
        return {r: json.loads(self.store.get(k)) for r, k in enumerate(keys) if self.store.check([k])}

    def _stacks(self, live: set[int]) -> dict[int, dict]:
        token = uuid.uuid4().hex
        self.store.set("dump", token)
        deadline = time.monotonic() + STACK_WAIT_S
        stacks: dict[int, dict] = {}
        while time.monotonic() < deadline and len(stacks) < len(live):
            for r in live - set(stacks):
                if self.store.check([f"stack/{r}"]):
                    dump = json.loads(self.store.get(f"stack/{r}"))
                    if dump.get("token") == token:
                        stacks[r] = dump
            time.sleep(0.05)
        return stacks

    def run(self) -> None:
        while not self.done.wait(0.5):
            try:
                now = time.monotonic()
                beats = self._beats()
                for r, beat in beats.items():
                    self.detector.observe(now, r, beat.get("progress", 0), beat.get("steps", 0))
                live = {r for r, b in beats.items()
                        if b.get("activity") != "exited" and time.time() - b.get("t", 0) < STALE_HEARTBEAT_S}
                timed_out = self.config.timeout_s is not None and now - self.started > self.config.timeout_s
                stalled = self.detector.stalled(now, live)
                if not (timed_out or stalled):
                    continue
                stacks = self._stacks(live)
                if timed_out or any(is_waiting(stacks.get(r, {}).get("stack", [])) for r in stalled):
                    reason = "timeout" if timed_out else "hang"
                    self.on_stop(build_snapshot(reason=reason, detector=self.detector, now=now, heartbeats=beats,
                                                live=live, stacks=stacks))
                    return
                for r in stalled:
                    self.detector.reset(r, now)
            except Exception:
                traceback.print_exc()
                return


def _run_script(config, watchdog_factory) -> int:
    from ddpdoctor import bootstrap

    try:
        bootstrap.run_script(config.script, list(config.script_args), watchdog_factory)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def run(config, *, json_path: Optional[str], fail_on: str, plain: bool) -> int:
    """Run the script as this rank; rank 0 also watches for hangs, gathers evidence and reports."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared_dir = os.environ.get(envvars.EVIDENCE_DIR)
    evidence_dir = shared_dir or tempfile.mkdtemp(prefix=f"ddpdoctor-rank{rank}-")
    os.environ[envvars.EVIDENCE_DIR] = evidence_dir
    os.environ[envvars.ACTIVE] = "1"
    os.environ[envvars.FINGERPRINT_EVERY] = str(config.fingerprint_every)
    started = time.monotonic()
    store = _connect(rank, world_size, host=True)
    report_args = dict(config=config, world_size=world_size, started=started, json_path=json_path,
                       fail_on=fail_on, plain=plain)
    monitor = None
    if rank == 0:
        def stop_job(snapshot: dict) -> None:
            store_for_report = _connect(rank, world_size, host=False)
            store_for_report.set("events/0", _local_events(evidence_dir))
            code = _report(store_for_report, outcome="hung" if snapshot["reason"] == "hang" else "timeout",
                           hang=snapshot, **report_args)
            store_for_report.set("abort", "1")
            # Rank 0 leaving closes its gloo connections, so peers blocked in collectives fail too.
            os._exit(code)

        monitor = HangMonitor(_connect(rank, world_size, host=False), world_size, config, stop_job)
        monitor.start()
    code = _run_script(config, lambda rec: StoreWatchdog(rec, _connect(rank, world_size, host=False), rank))
    try:
        store.set(f"events/{rank}", _local_events(evidence_dir))
        store.set(f"exit/{rank}", str(code))
        store.add("done", 1)
        if rank != 0:
            return code
        deadline = time.monotonic() + max(GATHER_WAIT_S, config.hang_timeout_s or 0)
        while store.add("done", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.1)
        if monitor is not None:
            monitor.done.set()
        return _report(store, outcome=None, hang=None, **report_args)
    finally:
        if not shared_dir:
            shutil.rmtree(evidence_dir, ignore_errors=True)


def _report(store, *, config, world_size: int, started: float, outcome: Optional[str], hang: Optional[dict],
            json_path, fail_on: str, plain: bool) -> int:
    from ddpdoctor import __version__, ui
    from ddpdoctor.analysis import all_findings, run_checks
    from ddpdoctor.evidence import load_dir
    from ddpdoctor.report import build_report, exit_code, write_json

    gathered = tempfile.mkdtemp(prefix="ddpdoctor-gathered-")
    exit_codes = {}
    try:
        for r in range(world_size):
            if store.check([f"events/{r}"]):
                with open(os.path.join(gathered, f"events-rank{r}.jsonl"), "wb") as f:
                    f.write(zlib.decompress(store.get(f"events/{r}")))
            if store.check([f"exit/{r}"]):
                exit_codes[r] = int(store.get(f"exit/{r}"))
        failures = [{"rank": r, "exitcode": c, "signal": None} for r, c in exit_codes.items() if c != 0]
        missing = sorted(set(range(world_size)) - set(exit_codes))
        if outcome is None:
            outcome = "failed" if failures or missing else "completed"
        evidence = load_dir(gathered, world_size=world_size, nnodes=_nnodes(), outcome=outcome,
                            script=config.script, failures=failures, hang=hang, timeout_s=config.timeout_s)
    finally:
        shutil.rmtree(gathered, ignore_errors=True)
    outcomes = run_checks(evidence)
    report = build_report(version=__version__, script=None if config.is_reference else config.script,
                          argv=list(config.script_args), evidence=evidence, outcomes=outcomes,
                          duration_s=time.monotonic() - started, mode="existing-launch")
    report["missing_ranks"] = missing if hang is None else hang.get("missing", [])
    plain = plain or ui.is_plain()
    ui.render_report(ui.make_console(plain), report, plain=plain)
    if json_path is not None:
        write_json(report, str(json_path))
    return exit_code(all_findings(outcomes), fail_on)


def _nnodes() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 1))
    except ValueError:
        return 1
