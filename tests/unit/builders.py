"""Builders of synthetic evidence for the analyzers' unit tests.

Every builder returns plain event dicts shaped like the probes' output (ddpdoctor/probes/*.py,
ddpdoctor/bootstrap.py), with defaults for everything a test does not care about, so each test
states only what matters. Nothing here imports torch.
"""

from __future__ import annotations

import copy
from typing import Iterable, Optional, Union

from ddpdoctor.evidence import Evidence, RankEvidence
from ddpdoctor.indices import encode_indices, order_hash

SCRIPT = "/job/train.py"


# -- generic ----------------------------------------------------------------------------------------

def site(line: int, file: str = SCRIPT, function: str = "main") -> list[dict]:
    """A probe call site: innermost-first list of user frames."""
    return [{"file": file, "line": line, "function": function}]


def event(kind: str, *, t: float = 0.0, step: int = 0, seq: int = 0, **fields) -> dict:
    """Any event with the recorder's common fields (rank is filled in by make_evidence)."""
    return {"kind": kind, "t": t, "step": step, "seq": seq, **fields}


def make_evidence(world_size: int = 2,
                  events: Union[None, dict[int, list[dict]], list[dict]] = None,
                  *, ranks: Optional[Iterable[int]] = None, **supervisor) -> Evidence:
    """Evidence of ``world_size`` ranks.

    ``events``: {rank: [event, ...]}, or one list of events every rank (or every rank in ``ranks``)
    recorded identically (deep-copied per rank). Supervisor fields (outcome, failures, hang,
    interrupted, nnodes, unranked, script...) pass through as keyword arguments.
    """
    if ranks is None:
        ranks = range(world_size)
    if events is None:
        per_rank: dict[int, list[dict]] = {r: [] for r in ranks}
    elif isinstance(events, list):
        per_rank = {r: copy.deepcopy(events) for r in ranks}
    else:
        per_rank = {r: list(evs) for r, evs in events.items()}
    evidence = Evidence(world_size=world_size, **supervisor)
    for rank, evs in sorted(per_rank.items()):
        for e in evs:
            e["rank"] = rank
        evidence.ranks[rank] = RankEvidence(rank=rank, events=evs)
    return evidence


def merge(*per_rank_maps: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """Concatenate several {rank: [events]} maps, rank by rank, in argument order."""
    out: dict[int, list[dict]] = {}
    for mapping in per_rank_maps:
        for rank, evs in mapping.items():
            out.setdefault(rank, []).extend(copy.deepcopy(evs))
    return out


def on_all(world_size: int, *events: dict) -> dict[int, list[dict]]:
    """The same events on every rank."""
    return {r: copy.deepcopy(list(events)) for r in range(world_size)}


# -- lifecycle / bootstrap -------------------------------------------------------------------------

def init_pg(world_size: int = 2, backend: str = "gloo", line: int = 5, **fields) -> dict:
    return event("init_pg", backend=backend, world_size=world_size, local_rank=None, node_rank=None,
                 host="host", pid=1000, site=site(line), **fields)


def process_start(fingerprint_every: int = 1, **fields) -> dict:
    return event("process_start", pid=1000, host="host", local_rank=None, node_rank=None,
                 world_size=None, fingerprint_every=fingerprint_every, **fields)


def exception(type_: str = "ValueError", message: str = "bad batch", *, t: float = 10.0, step: int = 0,
              line: Optional[int] = 42, **fields) -> dict:
    return event("exception", t=t, step=step, type=type_, message=message,
                 frames=[{"file": SCRIPT, "line": line, "function": "main", "user": True}] if line else [],
                 location={"file": SCRIPT, "line": line} if line else None, epoch=None, **fields)


def sys_exit(code: int = 3, *, t: float = 10.0, line: int = 50) -> dict:
    return event("sys_exit", t=t, code=code, location={"file": SCRIPT, "line": line})


def failure(rank: int, exitcode: int = 1, signal: Optional[str] = None, t: float = 100.0) -> dict:
    """One row of torchrun's failure table (ddpdoctor/agent.py)."""
    return {"rank": rank, "local_rank": rank, "pid": 2000 + rank, "exitcode": exitcode, "signal": signal, "t": t}


# -- DDP / optimizer -------------------------------------------------------------------------------

def ddp_wrap(params: Iterable[str] = ("fc.weight", "fc.bias"), *, ddp: int = 0, buffers: Iterable[str] = (),
             find_unused_parameters: bool = False, static_graph: bool = False, broadcast_buffers: bool = True,
             device: str = "cpu", line: int = 20, **fields) -> dict:
    params = list(params)
    return event("ddp_wrap", ddp=ddp, params=params, shapes=[[1] for _ in params], buffers=list(buffers),
                 find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                 broadcast_buffers=broadcast_buffers, sync_batchnorm=False, device=device, site=site(line),
                 **fields)


def optimizer(names: Iterable[str] = ("fc.weight", "fc.bias"), *, in_ddp: Optional[Iterable[bool]] = None,
              opt: int = 0, line: int = 30) -> dict:
    names = list(names)
    in_ddp = [True] * len(names) if in_ddp is None else list(in_ddp)
    return event("optimizer", opt=opt, names=names, in_ddp=in_ddp, shapes=[[1] for _ in names], site=site(line))


def window(synced: int = 1, unsynced: int = 0, inner: Optional[int] = None,
           unused: Optional[list] = ()) -> dict:
    """What one DDP wrapper did since the previous step (DDPState.take_window).

    ``inner`` defaults to synced + unsynced (every DDP forward runs the inner module once);
    ``unused=None`` means no DDP forward in the window.
    """
    return {"synced": synced, "unsynced": unsynced,
            "inner": synced + unsynced if inner is None else inner,
            "unused": None if unused is None else list(unused)}


def step(n: int, grads: Optional[list] = None, params: Optional[list] = None, *, opt: int = 0,
         ddp: Optional[dict] = None, t: Optional[float] = None) -> dict:
    """An optimizer step event. ``grads=None``: not fingerprinted (sampled out)."""
    fields = {"opt": opt, "n": n, "ddp": {"0": window()} if ddp is None else ddp}
    if grads is not None:
        fields["grads"] = grads
        fields["params"] = params if params is not None else [[1.0, 1.0] for _ in grads]
    return event("step", t=float(n) if t is None else t, step=n, **fields)


def fp(*values: float) -> list:
    """Fingerprints [[sum, norm], ...], one per value (sum = value, norm = abs(value) + 1)."""
    return [[float(v), abs(float(v)) + 1.0] for v in values]


def buffers(forward: int, fingerprints: list, *, ddp: int = 0) -> dict:
    return event("buffers", ddp=ddp, forward=forward, fp=fingerprints)


# -- data ------------------------------------------------------------------------------------------

def distributed_sampler(world_size: int, rank: int, dataset_len: int, *, num_replicas: Optional[int] = None,
                        shuffle: bool = True, drop_last: bool = False, epoch: int = 0, seed: int = 0) -> dict:
    """sampler info as data.py's _sampler_info records it for a DistributedSampler."""
    replicas = world_size if num_replicas is None else num_replicas
    if drop_last and dataset_len % replicas:
        num_samples = dataset_len // replicas
    else:
        num_samples = -(-dataset_len // replicas)
    return {"type": "DistributedSampler", "distributed": True, "batch_sampler": "BatchSampler",
            "num_replicas": replicas, "rank": rank, "shuffle": shuffle, "drop_last": drop_last, "seed": seed,
            "epoch": epoch, "num_samples": num_samples, "total_size": num_samples * replicas}


def plain_sampler(type_: str = "RandomSampler") -> dict:
    return {"type": type_, "distributed": False, "batch_sampler": "BatchSampler",
            "shuffle": type_ == "RandomSampler"}


def distributed_shard(dataset_len: int, world_size: int, rank: int, *, num_replicas: Optional[int] = None,
                      drop_last: bool = False) -> list[int]:
    """What an unshuffled DistributedSampler gives ``rank`` (padding by wrapping around)."""
    replicas = world_size if num_replicas is None else num_replicas
    total = distributed_sampler(world_size, rank, dataset_len, num_replicas=replicas, drop_last=drop_last)["total_size"]
    # torch pads by repeating the index list from its start, i.e. padded index i is i % dataset_len.
    return [i % dataset_len for i in range(rank, total, replicas)]


def loader_pass(indices: list[int], *, loader: str = f"{SCRIPT}:12", number: int = 0, steps: Optional[int] = None,
                sampler: Optional[dict] = None, dataset_len: Optional[int] = None, complete: bool = True,
                batch_size: int = 1, drop_last: bool = False, num_batches: Optional[int] = None,
                order: Optional[str] = None, line: int = 12, snapshot: bool = False) -> dict:
    """A loader_pass event. ``steps`` defaults to the number of batches (a training pass); 0 = eval.
    ``snapshot``: recorded mid-pass on a stack-dump request (then complete is False)."""
    batches = -(-len(indices) // batch_size) if num_batches is None else num_batches
    return event("loader_pass", loader=loader, number=number, complete=complete and not snapshot,
                 snapshot=snapshot, num_batches=batches,
                 num_samples=len(indices), indices=encode_indices(indices),
                 order=order_hash(indices) if order is None else order,
                 steps=batches if steps is None else steps, sampler=sampler or plain_sampler(),
                 site=site(line), batch_size=batch_size, drop_last=drop_last, num_workers=0,
                 dataset_len=dataset_len, dataset_type="TensorDataset", subset=False)


# -- collectives / join ----------------------------------------------------------------------------

def collective(op: str, n: int, shape: Optional[list] = (4,), dtype: str = "float32", *, line: int = 60,
               group=None, t: Optional[float] = None) -> dict:
    tensors = [] if shape is None else [[list(shape), dtype]]
    return event("collective", t=float(n) if t is None else t, seq=n, op=op, n=n, tensors=tensors, group=group,
                 site=site(line))


def join(phase: str = "enter", line: int = 70) -> dict:
    return event("join", phase=phase, site=site(line) if phase == "enter" else None)


def frame(line: int, *, user: bool, file: Optional[str] = None, function: str = "main") -> dict:
    return {"file": file or (SCRIPT if user else "/venv/torch/distributed/distributed_c10d.py"),
            "line": line, "function": function, "user": user}


def hang_snapshot(heartbeats: dict[int, dict], stacks: dict[int, list[dict]], *, reason: str = "hang",
                  threshold_s: float = 30.0, exited: Iterable[int] = (), missing: Iterable[int] = ()) -> dict:
    """The supervisor's _snapshot: string-keyed heartbeats, stall ages and stacks."""
    return {
        "reason": reason,
        "threshold_s": threshold_s,
        "stall_s": {str(r): 31.0 for r in heartbeats},
        "heartbeats": {str(r): {"rank": r, "activity": "training", "steps": 0, **b} for r, b in heartbeats.items()},
        "stacks": {str(r): {"token": "x", "stack": s} for r, s in stacks.items()},
        "exited": sorted(exited),
        "missing": sorted(missing),
    }


# -- checkpoints -----------------------------------------------------------------------------------

def save(path: Optional[str], *, seq_start: int = 0, seq_end: Optional[int] = None,
         fingerprint: Optional[str] = "fp-A", module_prefix: bool = False, line: int = 80, nbytes: int = 1234) -> dict:
    return event("save", seq=seq_start, path=path, bytes=nbytes, seq_start=seq_start,
                 seq_end=seq_start if seq_end is None else seq_end, fingerprint=fingerprint,
                 module_prefix=module_prefix, site=site(line))


def load(path: Optional[str], *, seq_start: int = 0, map_location: Optional[str] = "cpu", existed: Optional[bool] = True,
         error: Optional[str] = None, line: int = 90) -> dict:
    fields = dict(path=path, existed=existed, seq_start=seq_start, map_location=map_location, site=site(line))
    if error is not None:
        fields["error"] = error
    else:
        fields["module_prefix"] = False
    return event("load", seq=seq_start, **fields)


def dcp(op: str = "save", path: Optional[str] = "/ckpt/dcp", line: int = 95) -> dict:
    return event("dcp", op=op, path=path, site=site(line))
