"""collective-bandwidth: the reference job's collectives reach the bus bandwidth the user expects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis.api import Check, CheckResult, EvidenceRecord, Finding, evidence_field
from ddpdoctor.analysis.bandwidth import collective_benchmark, peak_busbw
from ddpdoctor.analysis.evidence import Evidence

ID = "collective-bandwidth"

DOCS = """\
## What it does
`ddpdoctor check` with no script (the reference job) ends with a collective sweep: all_reduce,
all_gather and reduce_scatter from 8 B to 1 GiB on GPUs (NCCL), 8 B to 4 MiB on CPUs (gloo). Bus
bandwidth is computed as nccl-tests does (algbw = bytes / time; busbw = algbw x 2(n-1)/n for
all_reduce, x (n-1)/n for all_gather and reduce_scatter; bytes = the whole buffer). This check
reports each operation's peak bus bandwidth and the slowest rank and host. With `--min-busbw GBPS`
(or `min-busbw` in `[tool.ddpdoctor]`) an operation whose peak stays below that floor is an
**error**: the flag is a gate you set on purpose for a smoke test, so it fails even at
`--fail-on error`. It skips when no benchmark ran (your own scripts).

## Why it matters
A job on a misconfigured fabric (NCCL falling back to TCP sockets instead of InfiniBand, NVLink or
P2P disabled, a wrong NCCL_SOCKET_IFNAME) trains correctly but several times slower. A smoke test
before a big run catches it in a minute instead of after a day of wasted GPU hours.

## Example
```bash
srun --ntasks-per-node=8 ddpdoctor check --min-busbw 150   # 8 H100s per node over NVLink and IB
```
`all_reduce peaks at 11.8 GB/s bus bandwidth, below --min-busbw 150` means the ranks talk over
sockets: NCCL_DEBUG=INFO shows the transport NCCL picked (NET/Socket instead of NET/IB).

## Use instead
Fix the fabric the slow operation points at: check `NCCL_DEBUG=INFO` for the transport, the
InfiniBand devices (`ibstat`), `NCCL_SOCKET_IFNAME`/`NCCL_IB_HCA`, and the slowest host named here.
"""


@dataclass(frozen=True)
class BelowMinBusbw(EvidenceRecord):
    """Operations whose peak bus bandwidth stayed below --min-busbw."""

    discriminator = {"kind": "below-min-busbw"}
    kind: str = evidence_field(hidden=True, default="below-min-busbw")
    min_busbw_gbps: Optional[float] = evidence_field(label="required bus bandwidth", unit="gbps")
    # op -> {busbw_gbps, bytes} at its peak
    peaks: dict[str, dict[str, Any]] = evidence_field(default_factory=dict, labels={"bytes": "size"})
    slowest_hosts: list[str] = evidence_field(default_factory=list)


def _gbps(value: float) -> str:
    return f"{value:.3g} GB/s"


def analyze(evidence: Evidence) -> CheckResult:
    benchmark = collective_benchmark(evidence)
    if benchmark is None or not benchmark["rows"]:
        return CheckResult(summary="no collective benchmark ran (it is part of the reference job)", applicable=False)
    peaks = peak_busbw(benchmark)
    summary = "peak busbw " + ", ".join(f"{op} {_gbps(row['busbw_gbps'])}" for op, row in peaks.items()) + \
        f" ({benchmark['backend']}, {benchmark['device']}, {benchmark['world_size']} ranks)"
    floor = evidence.observations.min_busbw_gbps
    if floor is None:
        return CheckResult(summary=summary)
    slow = {op: row for op, row in peaks.items() if row["busbw_gbps"] < floor}
    if not slow:
        return CheckResult(summary=summary + f", at or above --min-busbw {floor:g}")
    largest = {op: max((r for r in benchmark["rows"] if r["op"] == op), key=lambda r: r["bytes"]) for op in slow}
    slowest = sorted({r["slowest_rank"] for r in largest.values()})
    hosts = sorted({str(r["slowest_host"]) for r in largest.values() if r.get("slowest_host")})
    message = ("collective bandwidth below --min-busbw " + f"{floor:g} GB/s: " +
               "; ".join(f"{op} peaks at {_gbps(row['busbw_gbps'])}" for op, row in slow.items()) +
               f" ({benchmark['backend']}, {benchmark['world_size']} ranks); slowest at the largest size: "
               f"rank {', '.join(map(str, slowest))}" + (f" on {', '.join(hosts)}" if hosts else ""))
    return CheckResult(summary=summary, findings=[Finding(
        check=ID, severity="error", ranks=tuple(slowest), location=None, message=message,
        fix="Run with NCCL_DEBUG=INFO to see the transport NCCL chose (NET/IB vs NET/Socket, P2P/NVLink), check "
            "NCCL_SOCKET_IFNAME / NCCL_IB_HCA and the slowest host's links; or lower --min-busbw if the "
            "expectation was too high for this fabric.",
        evidence=BelowMinBusbw(min_busbw_gbps=floor, slowest_hosts=hosts,
                               peaks={op: {"busbw_gbps": row["busbw_gbps"], "bytes": row["bytes"]}
                                      for op, row in slow.items()}))])


CHECK = Check(id=ID, title="collectives reach the expected bandwidth", analyze=analyze, docs=DOCS, order=120,
              evidence=(BelowMinBusbw,))
