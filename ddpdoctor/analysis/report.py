"""The report model and its JSON form (schema ``ddpdoctor.report/1``, see design.md)."""

from __future__ import annotations

import json
import os
from typing import Optional

from ddpdoctor.analysis import CheckOutcome, all_findings
from ddpdoctor.check_api import SEVERITY_ORDER, Finding
from ddpdoctor.evidence import Evidence

SCHEMA = "ddpdoctor.report/1"


def _backend_and_device(evidence: Evidence) -> tuple[str, str]:
    backends = sorted({str(e.get("backend")) for _, e in evidence.events("init_pg") if e.get("backend")})
    devices = sorted({str(e.get("device")).split(":")[0] for _, e in evidence.events("ddp_wrap") if e.get("device")})
    return ",".join(backends) or "none", ",".join(devices) or "cpu"


def build_report(*, version: str, script: Optional[str], argv: list[str], evidence: Evidence,
                 outcomes: list[CheckOutcome], duration_s: float, mode: str) -> dict:
    backend, device = _backend_and_device(evidence)
    nodes = sorted({ev.node_rank for ev in evidence.ranks.values() if ev.node_rank is not None})
    return {
        "schema": SCHEMA,
        "version": version,
        "script": script,
        "argv": argv,
        "world_size": evidence.world_size,
        "nnodes": evidence.nnodes,
        "backend": backend,
        "device": device,
        "outcome": evidence.outcome,
        "duration_s": round(duration_s, 3),
        "launch_mode": mode,
        "ranks": [
            {"rank": r, "host": ev.host, "node": ev.node_rank, "local_rank": ev.local_rank, "pid": ev.pid}
            for r, ev in sorted(evidence.ranks.items())
        ],
        "nodes": nodes,
        "checks": [
            {"id": o.id, "status": o.status, "summary": o.result.summary, **({"error": o.error} if o.error else {})}
            for o in outcomes
        ],
        "findings": [f.to_json() for f in all_findings(outcomes)],
    }


def exit_code(findings: list[Finding], fail_on: str) -> int:
    """0 when nothing reaches ``fail_on``, else 1 (design.md's exit-code contract)."""
    threshold = SEVERITY_ORDER[fail_on]
    return 1 if any(SEVERITY_ORDER[f.severity] >= threshold for f in findings) else 0


def write_json(report: dict, path: str) -> None:
    """Write atomically so CI never reads a half-written report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)
