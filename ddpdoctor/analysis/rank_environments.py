"""Every rank's environment, merged from its events: the report's ``environment`` field, what
``ddpdoctor env`` shows and what the env-consistency check compares.

The GPU a rank used is the device of its first DDP model on CUDA (what NCCL's gradient all-reduce
runs on), else ``torch.cuda.current_device()`` when the script ended. It is identified across
ranks by host plus the GPU's UUID (or PCI bus id), else by the CUDA_VISIBLE_DEVICES entry the
index maps to, so two ranks of one host that see different GPU subsets still compare correctly.
"""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.analysis.evidence import Evidence, RankEvidence
from ddpdoctor.schema.events import DDPWrap, InitProcessGroup, RankDevices, RankEnvironment

__all__ = ["rank_environments", "physical_gpu"]


def _used_device(ev: RankEvidence, devices: Optional[RankDevices]) -> Optional[dict[str, Any]]:
    for wrap in ev.of(DDPWrap):
        kind, _, index = (wrap.device or "").partition(":")
        if kind == "cuda":
            return {"index": int(index) if index.isdigit() else (devices.current_device if devices else 0),
                    "source": "DDP model"}
    if devices is not None and devices.current_device is not None:
        return {"index": devices.current_device, "source": "current device at exit"}
    return None


def _environment(rank: int, ev: RankEvidence) -> Optional[dict[str, Any]]:
    env = ev.first(RankEnvironment)
    if env is None:
        return None
    devices = ev.of(RankDevices)[-1] if ev.of(RankDevices) else None
    init = ev.first(InitProcessGroup)
    gpus = list(devices.gpus) if devices else []
    used = _used_device(ev, devices)
    if used is not None:
        gpu = next((g for g in gpus if g.get("index") == used["index"]), None)
        used.update({k: gpu.get(k) for k in ("name", "uuid", "pci_bus_id")} if gpu else {})
    return {"rank": rank, "host": env.host or ev.host, "local_rank": env.local_rank, "node": env.node_rank,
            "python": env.python_version, "torch": env.torch_version, "cuda": env.cuda_version,
            "cudnn": env.cudnn_version, "nccl": env.nccl_version,
            "driver": env.driver_version or (devices.driver_version if devices else None),
            "platform": env.platform, "backend": init.backend if init else None, "gpus": gpus, "device": used,
            "variables": dict(env.variables)}


def rank_environments(evidence: Evidence) -> list[dict[str, Any]]:
    """One entry per rank that recorded its environment, by rank."""
    out = []
    for rank, ev in sorted(evidence.ranks.items()):
        env = _environment(rank, ev)
        if env is not None:
            out.append(env)
    return out


def physical_gpu(env: dict[str, Any]) -> Optional[str]:
    """An id of the GPU a rank used, equal for two ranks on one GPU of one host; None: no GPU used."""
    device = env.get("device")
    if not device:
        return None
    if device.get("uuid"):
        return str(device["uuid"])
    if device.get("pci_bus_id"):
        return f"PCI {device['pci_bus_id']}"
    index = device.get("index")
    visible = [e.strip() for e in (env.get("variables", {}).get("CUDA_VISIBLE_DEVICES") or "").split(",") if e.strip()]
    if isinstance(index, int) and index < len(visible):
        return f"GPU {visible[index]}"
    return f"GPU {index}"
