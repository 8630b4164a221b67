"""Run a script in a fresh interpreter as rank 0 of a one-rank torch.distributed job: for the unit tests
whose probes need a real process group, or must be installed before torch's first import."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one_rank(script: str, *args: str, evidence: Path) -> tuple[str, list[dict]]:
    """``python -c script args`` with a one-rank rendezvous and ``evidence`` as the evidence folder (also in
    $EVIDENCE): its standard output, and the events it wrote there, if any, but the environment's (the
    rendezvous port, among others)."""
    env = {**os.environ, "EVIDENCE": str(evidence), "DDPDOCTOR_EVIDENCE_DIR": str(evidence),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    names = [n for n in os.listdir(evidence) if n.startswith("events")] if evidence.is_dir() else []
    events = [json.loads(line) for name in names for line in (evidence / name).read_text().splitlines()]
    return out.stdout, [e for e in events if e["kind"] != "environment"]
