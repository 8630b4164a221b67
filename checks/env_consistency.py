"""env-consistency: every rank runs the same software, with the same NCCL settings, on its own GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ddpdoctor.analysis.api import (Check, CheckResult, EvidenceRecord, Explains, Finding, RUN, ENVIRONMENT, Severity,
                                    evidence_field)
from ddpdoctor.analysis.decode import DUPLICATE_GPU
from ddpdoctor.analysis.rank_environments import physical_gpu, rank_environments
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import RankFailed
from ddpdoctor.schema.findings import ABSENT, FieldInfo

from ._common import fmt_ranks

ID = "env-consistency"

DOCS = """\
## What it does
Compares what every rank recorded at start-up (`ddpdoctor env` shows it): torch, CUDA and NCCL
versions (an error when they differ), Python and cuDNN versions (a warning), every `NCCL_*` and
`TORCH_NCCL_*` variable (a warning when ranks differ), and, in an NCCL job, which GPU each rank
used (an error when two ranks of one host share a GPU). A rank's GPU is the device of its DDP model,
else its current CUDA device at exit, identified by UUID or PCI bus id, else by the
CUDA_VISIBLE_DEVICES entry it maps to.

## Why it matters
Mixed torch or NCCL builds across nodes hang or crash in the first collective, or worse, run with
different numerics. NCCL settings that differ between ranks (a socket interface, a protocol,
`NCCL_P2P_DISABLE` on one node) make ranks choose incompatible transports and hang. Two ranks on
one GPU make NCCL abort with "Duplicate GPU detected" (reported here as the cause, the crash as its
consequence); with gloo they silently halve the GPU for each.

## Example
```python
dist.init_process_group("nccl")
model = DDP(Net().cuda())                 # no set_device: every rank of the node on cuda:0
```
```bash
NCCL_SOCKET_IFNAME=eth0 srun ...          # exported on one node only
```

## Use instead
```python
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = DDP(Net().cuda(), device_ids=[local_rank])
```
Use one container image or environment on every node, and set NCCL variables for the whole job
(in the sbatch script, not per node).
"""

ERROR_VERSIONS = (("torch", "torch"), ("cuda", "CUDA (torch build)"), ("nccl", "NCCL"))
WARNING_VERSIONS = (("python", "Python"), ("cudnn", "cuDNN"))
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_")


RankValues = dict[str, Any]  # rank -> its value (None: unset)


@dataclass(frozen=True)
class VersionsDiffer(EvidenceRecord):
    """The versions that differ across ranks, each as rank -> version (only those that differ)."""

    discriminator = {"kind": "versions"}
    kind: str = evidence_field(hidden=True, default="versions")
    torch: RankValues = evidence_field(default=ABSENT)
    cuda: RankValues = evidence_field(default=ABSENT)
    nccl: RankValues = evidence_field(default=ABSENT)
    python: RankValues = evidence_field(default=ABSENT)
    cudnn: RankValues = evidence_field(default=ABSENT)


@dataclass(frozen=True)
class NcclVariablesDiffer(EvidenceRecord):
    """The NCCL_* and TORCH_NCCL_* variables that differ across ranks: each under its own name, as
    rank -> value, beside ``kind`` (their names are the environment's, so they are no declared fields)."""

    discriminator = {"kind": "nccl-variables"}
    kind: str = evidence_field(hidden=True, default="nccl-variables")
    variables: Mapping[str, RankValues] = evidence_field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **{name: dict(values) for name, values in self.variables.items()}}

    def rows(self) -> Iterator[tuple[str, Any, FieldInfo]]:
        yield "kind", self.kind, FieldInfo(hidden=True)
        for name, values in self.variables.items():
            yield name, values, FieldInfo()

    @classmethod
    def matches(cls, data: Mapping[str, Any]) -> bool:
        return data.get("kind") == cls.discriminator["kind"]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "NcclVariablesDiffer":
        return cls(variables={k: v for k, v in data.items() if k != "kind"})


@dataclass(frozen=True)
class SharedGpu(EvidenceRecord):
    """Ranks of one host on one GPU in an NCCL job: per GPU, {host, gpu, ranks, local_ranks, device_index}."""

    discriminator = {"kind": "shared-gpu"}
    kind: str = evidence_field(hidden=True, default="shared-gpu")
    gpus: list[dict[str, Any]] = evidence_field(default_factory=list)


def _shares_a_gpu(finding: Finding) -> bool:
    return finding.severity == Severity.ERROR and isinstance(finding.evidence, SharedGpu)


def _duplicate_gpu_crash(symptom: Finding, _cause: Finding) -> bool:
    """NCCL's "Duplicate GPU detected" crash (or a peer's failure after it) when ranks share a GPU."""
    failed = symptom.evidence
    return isinstance(failed, RankFailed) and (failed.error_code == DUPLICATE_GPU or bool(failed.secondary_only))


EXPLAINS = (
    # Two ranks on one GPU: this check names the ranks and the GPU; NCCL's crash follows.
    Explains("ranks share a GPU", _duplicate_gpu_crash, cause=_shares_a_gpu, priority=20),
)


def _spread(values: dict[int, object]) -> str:
    """'2.13.0 on ranks 0, 1; 2.12.0 on rank 2'."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault("unset" if value is None else str(value), []).append(rank)
    return "; ".join(f"{value} on {fmt_ranks(ranks)}" for value, ranks in
                     sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0])))


def _differing(envs: list[dict], keys: tuple[tuple[str, str], ...]) -> dict[str, dict[int, object]]:
    out = {}
    for key, _ in keys:
        values = {e["rank"]: e.get(key) for e in envs}
        if len({str(v) for v in values.values()}) > 1:
            out[key] = values
    return out


def _version_finding(envs: list[dict], keys: tuple[tuple[str, str], ...], severity: str) -> list[Finding]:
    differing = _differing(envs, keys)
    if not differing:
        return []
    names = dict(keys)
    parts = [f"{names[key]} {_spread(values)}" for key, values in differing.items()]
    return [Finding(
        check=ID, severity=severity, ranks=tuple(e["rank"] for e in envs), location=None,
        message="ranks run different software: " + " | ".join(parts),
        fix="Run every rank from one environment or container image (the same torch build, CUDA and NCCL); "
            "`ddpdoctor env` shows what each rank has.",
        evidence=VersionsDiffer(**{key: {str(r): v for r, v in values.items()} for key, values in differing.items()}))]


def _nccl_variables(envs: list[dict]) -> list[Finding]:
    names = sorted({k for e in envs for k in e["variables"] if k.startswith(NCCL_PREFIXES)})
    differing = {}
    for name in names:
        values = {e["rank"]: e["variables"].get(name) for e in envs}
        if len(set(values.values())) > 1:
            differing[name] = values
    if not differing:
        return []
    ranks = sorted({r for values in differing.values() for r in values})
    return [Finding(
        check=ID, severity="warning", ranks=tuple(ranks), location=None,
        message="NCCL settings differ between ranks: " + " | ".join(f"{name} {_spread(values)}"
                                                                     for name, values in differing.items()),
        fix="Set NCCL_* variables for the whole job (in the sbatch script or the launcher's environment), "
            "the same on every node, unless a node really needs its own interface name.",
        evidence=NcclVariablesDiffer(variables={name: {str(r): v for r, v in values.items()}
                                                for name, values in differing.items()}))]


def _shared_gpus(envs: list[dict]) -> list[Finding]:
    if not any("nccl" in (e.get("backend") or "") for e in envs):
        return []
    owners: dict[tuple[str, str], list[dict]] = {}
    for env in envs:
        gpu = physical_gpu(env)
        if gpu is not None:
            owners.setdefault((env["host"], gpu), []).append(env)
    shared = [(host, gpu, group) for (host, gpu), group in sorted(owners.items()) if len(group) > 1]
    if not shared:
        return []
    ranks = sorted(e["rank"] for _, _, group in shared for e in group)
    described = "; ".join(f"{fmt_ranks(e['rank'] for e in group)} on {gpu} of {host} "
                          f"(cuda:{group[0]['device']['index']}, from the {group[0]['device']['source']})"
                          for host, gpu, group in shared)
    return [Finding(
        check=ID, severity="error", ranks=tuple(ranks), location=None,
        message=f"ranks share a GPU in an NCCL job: {described}; NCCL needs one process per GPU",
        fix="Call `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` before init_process_group and put the "
            "model on that device (`DDP(model, device_ids=[local_rank])`); run at most one rank per visible GPU "
            "(`--nproc-per-node` = GPUs per node).",
        evidence=SharedGpu(gpus=[
            {"host": host, "gpu": gpu, "ranks": [e["rank"] for e in group],
             "local_ranks": [e["local_rank"] for e in group], "device_index": group[0]["device"]["index"]}
            for host, gpu, group in shared]))]


def analyze(evidence: Evidence) -> CheckResult:
    envs = rank_environments(evidence)
    if len(envs) < 2:
        return CheckResult(summary=f"{len(envs)} rank(s) recorded their environment: nothing to compare",
                           applicable=False)
    findings = [*_version_finding(envs, ERROR_VERSIONS, "error"), *_shared_gpus(envs),
                *_version_finding(envs, WARNING_VERSIONS, "warning"), *_nccl_variables(envs)]
    if findings:
        return CheckResult(findings=findings, summary="; ".join(
            "ranks share a GPU" if isinstance(f.evidence, SharedGpu) else f.evidence.kind.replace("-", " ") + " differ"
            for f in findings))
    first = envs[0]
    gpus = sum(1 for e in envs if e.get("device"))
    summary = (f"{len(envs)} ranks alike: torch {first['torch']}, CUDA {first['cuda'] or 'none'}, "
               f"NCCL {first['nccl'] or 'none'}" + (f", {gpus} rank(s) each on its own GPU" if gpus else ""))
    return CheckResult(summary=summary)


CHECK = Check(id=ID, title="every rank runs the same environment", analyze=analyze, docs=DOCS, order=110,
              probes=('environment',),
              evidence=(VersionsDiffer, NcclVariablesDiffer, SharedGpu), explains=EXPLAINS,
              sources=frozenset({RUN, ENVIRONMENT}))
