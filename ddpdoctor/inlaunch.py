"""Launch mode 2: ddpdoctor runs inside an existing torchrun/srun launch, one copy per rank.

Every rank installs the probes and runs the script in-process. At the end each rank sends its
events through a c10d TCPStore (no shared filesystem needed): torchrun's agent store when there is
one, otherwise a store hosted by rank 0 on MASTER_PORT+1 (DDPDOCTOR_STORE_PORT overrides). Rank 0
analyzes and reports; the other ranks exit with the script's own status.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import zlib
from datetime import timedelta
from typing import Optional

from ddpdoctor import envvars

GATHER_WAIT_S = 60.0


def inside_existing_launch() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and envvars.ACTIVE not in os.environ


def _store(rank: int, world_size: int):
    from torch.distributed import PrefixStore, TCPStore

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=GATHER_WAIT_S)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = TCPStore(host, int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    else:
        port = int(os.environ.get("DDPDOCTOR_STORE_PORT") or int(os.environ.get("MASTER_PORT", "29500")) + 1)
        store = TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or "default"
    return PrefixStore(f"ddpdoctor/{run_id}/", store)


def _run_script(script: str, args: list[str]) -> int:
    from ddpdoctor import bootstrap

    try:
        bootstrap.run_script(script, args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _local_events(evidence_dir: str) -> bytes:
    chunks = []
    for path in sorted(glob.glob(os.path.join(evidence_dir, "events-*.jsonl"))):
        with open(path, "rb") as f:
            chunks.append(f.read())
    return zlib.compress(b"".join(chunks))


def run(config, *, json_path: Optional[str], fail_on: str, plain: bool) -> int:
    """Run the script as this rank; on rank 0, gather every rank's evidence and report."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared_dir = os.environ.get(envvars.EVIDENCE_DIR)
    evidence_dir = shared_dir or tempfile.mkdtemp(prefix=f"ddpdoctor-rank{rank}-")
    os.environ[envvars.EVIDENCE_DIR] = evidence_dir
    os.environ[envvars.ACTIVE] = "1"
    os.environ[envvars.FINGERPRINT_EVERY] = str(config.fingerprint_every)
    started = time.monotonic()
    code = _run_script(config.script, list(config.script_args))
    try:
        store = _store(rank, world_size)
        store.set(f"events/{rank}", _local_events(evidence_dir))
        store.set(f"exit/{rank}", str(code))
        store.add("done", 1)
        if rank != 0:
            return code
        return _report(store, config, world_size, evidence_dir, started, json_path=json_path,
                       fail_on=fail_on, plain=plain)
    finally:
        if not shared_dir:
            shutil.rmtree(evidence_dir, ignore_errors=True)


def _report(store, config, world_size: int, evidence_dir: str, started: float, *, json_path, fail_on, plain) -> int:
    from ddpdoctor import __version__, ui
    from ddpdoctor.analysis import all_findings, run_checks
    from ddpdoctor.evidence import load_dir
    from ddpdoctor.report import build_report, exit_code, write_json

    deadline = time.monotonic() + max(GATHER_WAIT_S, config.hang_timeout_s or 0)
    while store.add("done", 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.1)
    gathered = tempfile.mkdtemp(prefix="ddpdoctor-gathered-")
    exit_codes = {}
    try:
        for r in range(world_size):
            if not store.check([f"events/{r}"]):
                continue
            with open(os.path.join(gathered, f"events-rank{r}.jsonl"), "wb") as f:
                f.write(zlib.decompress(store.get(f"events/{r}")))
            exit_codes[r] = int(store.get(f"exit/{r}"))
        failures = [{"rank": r, "exitcode": c, "signal": None} for r, c in exit_codes.items() if c != 0]
        missing = sorted(set(range(world_size)) - set(exit_codes))
        outcome = "failed" if failures or missing else "completed"
        evidence = load_dir(gathered, world_size=world_size, nnodes=_nnodes(), outcome=outcome,
                            script=config.script, failures=failures)
    finally:
        shutil.rmtree(gathered, ignore_errors=True)
    outcomes = run_checks(evidence)
    report = build_report(version=__version__, script=None if config.is_reference else config.script,
                          argv=list(config.script_args), evidence=evidence, outcomes=outcomes,
                          duration_s=time.monotonic() - started, mode="existing-launch")
    report["missing_ranks"] = missing
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
