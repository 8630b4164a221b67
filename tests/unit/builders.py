"""Builders of synthetic evidence for the analyzers' unit tests.

Every builder returns the same typed event classes the probes write (ddpdoctor/schema/events.py),
with defaults for everything a test does not care about, so each test states only what matters
and a field the schema does not have is a TypeError here too. Nothing here imports torch.
"""

from __future__ import annotations

import copy
import struct
from typing import Iterable, Optional, Union

from ddpdoctor.analysis.evidence import Evidence, RankEvidence
from ddpdoctor.schema import events as ev
from ddpdoctor.schema.fingerprints import encode_fingerprints
from ddpdoctor.schema.indices import encode_indices, order_hash
from ddpdoctor.schema.observations import Failure, Heartbeat, Observations, RankState, StopSnapshot
from ddpdoctor.supervisor.hang import classify

SCRIPT = "/job/train.py"


# -- generic ----------------------------------------------------------------------------------------

def site(line: int, file: str = SCRIPT, function: str = "main") -> list[dict]:
    """A probe call site: innermost-first list of user frames."""
    return [{"file": file, "line": line, "function": function}]


def make_evidence(world_size: int = 2,
                  events: Union[None, dict[int, list[ev.Event]], list[ev.Event]] = None,
                  *, ranks: Optional[Iterable[int]] = None, unranked: Optional[list[ev.Event]] = None,
                  script: Optional[str] = None, **observations) -> Evidence:
    """Evidence of ``world_size`` ranks.

    ``events``: {rank: [event, ...]}, or one list of events every rank (or every rank in ``ranks``)
    recorded identically (deep-copied per rank). Observation fields (outcome, failures, stop,
    timeout_s, nnodes, output_tails, stalls...) pass through as keyword arguments.
    """
    if ranks is None:
        ranks = range(world_size)
    if events is None:
        per_rank: dict[int, list[ev.Event]] = {r: [] for r in ranks}
    elif isinstance(events, list):
        per_rank = {r: copy.deepcopy(events) for r in ranks}
    else:
        per_rank = {r: list(evs) for r, evs in events.items()}
    evidence = Evidence(observations=Observations(world_size=world_size, **observations), script=script,
                        unranked=list(unranked or []))
    for rank, evs in sorted(per_rank.items()):
        for e in evs:
            e.rank = rank
        evidence.ranks[rank] = RankEvidence(rank=rank, events=evs)
    return evidence


def merge(*per_rank_maps: dict[int, list[ev.Event]]) -> dict[int, list[ev.Event]]:
    """Concatenate several {rank: [events]} maps, rank by rank, in argument order."""
    out: dict[int, list[ev.Event]] = {}
    for mapping in per_rank_maps:
        for rank, evs in mapping.items():
            out.setdefault(rank, []).extend(copy.deepcopy(evs))
    return out


def on_all(world_size: int, *events: ev.Event) -> dict[int, list[ev.Event]]:
    """The same events on every rank."""
    return {r: copy.deepcopy(list(events)) for r in range(world_size)}


# -- lifecycle / bootstrap -------------------------------------------------------------------------

def init_pg(world_size: int = 2, backend: str = "gloo", line: int = 5, **fields) -> ev.InitProcessGroup:
    return ev.InitProcessGroup(backend=backend, world_size=world_size, host="host", pid=1000, site=site(line), **fields)


def process_start(fingerprint_every: int = 1, **fields) -> ev.ProcessStart:
    return ev.ProcessStart(pid=1000, host="host", fingerprint_every=fingerprint_every, **fields)


def exit_event(code: int = 0) -> ev.Exit:
    return ev.Exit(code=code)


def exception(type_: str = "ValueError", message: str = "bad batch", *, t: float = 10.0, step: int = 0,
              line: Optional[int] = 42, seq: int = 0, file: str = SCRIPT) -> ev.ExceptionEvent:
    return ev.ExceptionEvent(t=t, step=step, seq=seq, type=type_, message=message,
                             frames=[{"file": file, "line": line, "function": "main", "user": True}] if line else [],
                             location={"file": file, "line": line} if line else None)


def sys_exit(code: int = 3, *, t: float = 10.0, line: int = 50) -> ev.SysExit:
    return ev.SysExit(t=t, code=code, location={"file": SCRIPT, "line": line})


def failure(rank: int, exitcode: int = 1, signal: Optional[str] = None, t: float = 100.0) -> Failure:
    """One row of torchrun's failure table (ddpdoctor/rank/agent.py)."""
    return Failure(rank=rank, local_rank=rank, pid=2000 + rank, exitcode=exitcode, signal=signal, t=t)


def probe_error(probe: str = "data", error: str = "AttributeError: boom", target: Optional[str] = None,
                phase: str = "run") -> ev.ProbeError:
    return ev.ProbeError(probe=probe, error=error, target=target, phase=phase)


# -- DDP / optimizer -------------------------------------------------------------------------------

def ddp_wrap(params: Iterable[str] = ("fc.weight", "fc.bias"), *, ddp: int = 0, buffers: Iterable[str] = (),
             find_unused_parameters: bool = False, static_graph: bool = False, broadcast_buffers: bool = True,
             device: str = "cpu", line: int = 20, group_ranks: Iterable[int] = ()) -> ev.DDPWrap:
    params = list(params)
    return ev.DDPWrap(ddp=ddp, params=params, shapes=[[1] for _ in params], buffers=list(buffers),
                      find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                      broadcast_buffers=broadcast_buffers, device=device, site=site(line),
                      group_ranks=list(group_ranks))


def data_parallel(module: str = "Net", device_ids: Iterable[int] = (0, 1), *, line: int = 18) -> ev.DataParallelWrap:
    """A model wrapped in single-process nn.DataParallel over ``device_ids``."""
    return ev.DataParallelWrap(module=module, device_ids=list(device_ids), site=site(line))


def sharded(api: str = "fully_shard", module: str = "Net", *, mesh_shape: Iterable[int] = (2,),
            mesh_dims: Optional[Iterable[str]] = None, hybrid: bool = False, line: int = 19,
            replicate_group: Iterable[int] = ()) -> ev.ShardedWrap:
    """A model sharded (fully_shard, FullyShardedDataParallel) or replicated (replicate) over a mesh;
    ``replicate_group``: the ranks holding the recording rank's shard (empty: not recorded)."""
    shape = list(mesh_shape)
    return ev.ShardedWrap(api=api, module=module, mesh_shape=shape,
                          mesh_dims=list(mesh_dims) if mesh_dims is not None else [""] * len(shape),
                          hybrid=hybrid, site=site(line), replicate_group=list(replicate_group))


def optimizer(names: Iterable[str] = ("fc.weight", "fc.bias"), *, in_ddp: Optional[Iterable[bool]] = None,
              ddp_of: Optional[Iterable[Optional[int]]] = None, opt: int = 0, line: int = 30,
              built_line: Optional[int] = None, group_sizes: Optional[list] = None, type_name: str = "SGD",
              n: int = 1, dtypes: Optional[list] = None) -> ev.OptimizerInfo:
    names = list(names)
    in_ddp = [True] * len(names) if in_ddp is None else list(in_ddp)
    ddp_of = [0 if inside else None for inside in in_ddp] if ddp_of is None else list(ddp_of)
    return ev.OptimizerInfo(opt=opt, names=names, in_ddp=in_ddp, ddp_of=ddp_of, shapes=[[1] for _ in names],
                            site=site(line), type_name=type_name, built_at=site(built_line) if built_line else [],
                            group_sizes=[len(names)] if group_sizes is None else group_sizes, n=n,
                            dtypes=dtypes if dtypes is not None else ["torch.float32"] * len(names))


def unchanged(n: int, params: dict, *, opt: int = 0, median: Optional[float] = 1.0) -> ev.UnchangedWeights:
    """What the rank measured of weights step ``n`` left unchanged: {position: [gradient RMS, update
    to spacing ratio]} and the optimizer's median gradient RMS."""
    return ev.UnchangedWeights(t=float(n) + 0.5, step=n, opt=opt, n=n,
                               params={str(k): list(v) for k, v in params.items()}, grad_rms_median=median)


def forwards(synced: int = 1, unsynced: int = 0, inner: Optional[int] = None) -> dict:
    """Training forwards of one DDP module since the previous step of an optimizer.

    ``inner`` defaults to synced + unsynced (every DDP forward runs the inner module once).
    """
    return {"synced": synced, "unsynced": unsynced, "inner": synced + unsynced if inner is None else inner}


def step(n: int, grads: Optional[list] = None, params: Optional[list] = None, *, opt: int = 0,
         ddp: Optional[dict] = None, t: Optional[float] = None, closure: bool = False, config: Optional[str] = None,
         touched: Optional[int] = None, reduced: Optional[list] = None) -> ev.Step:
    """An optimizer step event. ``grads=None``: not fingerprinted (sampled out). ``config``: its
    configuration digest; ``touched``/``reduced``: gradients changed since DDP's all-reduce, and
    their fingerprints as it left them."""
    step_event = ev.Step(t=float(n) if t is None else t, step=n, opt=opt, n=n,
                         forwards={"0": forwards()} if ddp is None else ddp, closure=closure, config=config,
                         touched=touched, reduced=encode_fingerprints(reduced) if reduced is not None else None)
    if grads is not None:
        step_event.grads = encode_fingerprints(grads)
        step_event.params = encode_fingerprints(params if params is not None else [[1.0, 1.0] for _ in grads])
    return step_event


# -- training configuration ------------------------------------------------------------------------

def config_state(n: int = 1, digest: str = "cfg-A", *, opt: int = 0, lr: float = 0.1, groups: Optional[list] = None,
                 eval_types: Optional[dict] = None, count: int = 5, frozen: int = 0, frozen_names: Iterable[str] = (),
                 autocast: Optional[list] = None, scale: Optional[float] = None, flips: Optional[list] = None
                 ) -> ev.ConfigState:
    """What a rank's configuration digest stands for (one DDP module, index 0)."""
    return ev.ConfigState(step=n - 1, opt=opt, n=n, digest=digest,
                          groups=groups if groups is not None else [{"lr": lr, "momentum": 0.9, "nesterov": False}],
                          modules={"0": {"count": count, "eval": dict(eval_types or {}), "flips": list(flips or [])}},
                          frozen={"0": {"count": 4, "frozen": frozen, "names": list(frozen_names), "more": 0}},
                          autocast={"0": autocast or [False, "torch.bfloat16"]}, scale=scale)


def mode_change(training: bool, *, line: int = 44, ddp: Optional[int] = 0, name: Optional[str] = "",
                type_name: str = "Net", step_: int = 0) -> ev.ModeChange:
    return ev.ModeChange(step=step_, ddp=ddp, name=name, type_name=type_name, training=training, site=site(line))


def param_groups_write(n: int, keys: list, *, line: int = 50, via: str = "scheduler",
                       opt: int = 0) -> ev.ParamGroupsWrite:
    return ev.ParamGroupsWrite(step=n - 1, opt=opt, n=n, keys=keys, via=via, sites=[{**site(line)[0], "via": via}])


def module_conversion(method: str, target: str, *, swapped: bool = True, device_move: bool = False, line: int = 55,
                      step_: int = 0, ddp: int = 0, t: float = 0.0) -> ev.ModuleConversion:
    return ev.ModuleConversion(t=t, step=step_, ddp=ddp, method=method, target=target, device_move=device_move,
                               swapped=swapped, site=site(line))


def ddp_rewrap(ddp: int, previous: int = 0, *, step_: int = 0) -> ev.DDPRewrap:
    return ev.DDPRewrap(step=step_, ddp=ddp, previous=previous)


def ddp_bypass(*, line: int = 66, ddp: int = 0, step_: int = 0) -> ev.DDPBypass:
    return ev.DDPBypass(step=step_, ddp=ddp, forwards=1, site=site(line))


def comm_hook(name: str = "my_hook", *, line: int = 25, ddp: Optional[int] = 0) -> ev.CommHook:
    return ev.CommHook(ddp=ddp, name=name, module="train", site=site(line))


def usage(iterations: int, unused: Optional[dict[int, int]] = None, *, ddp: int = 0,
          last_unused: Iterable[int] = (), final: bool = True) -> ev.DDPUsage:
    """DDP usage totals: ``unused`` maps parameter index -> iterations without a gradient."""
    return ev.DDPUsage(ddp=ddp, iterations=iterations, unused={str(i): c for i, c in (unused or {}).items()},
                       last_unused=list(last_unused), final=final)


def fp(*values: float) -> list:
    """Word-sum fingerprints [[sum], ...], one per value: equal values give equal fingerprints, any
    other value another one (the float64 bit pattern of the value, as a signed 64-bit integer)."""
    return [[struct.unpack("<q", struct.pack("<d", float(v)))[0]] for v in values]


def buffers(forward: int, fingerprints: list, *, ddp: int = 0) -> ev.BufferFingerprint:
    return ev.BufferFingerprint(ddp=ddp, forward=forward, fp=fingerprints)


# -- data ------------------------------------------------------------------------------------------

def distributed_sampler(world_size: int, rank: int, dataset_len: int, *, num_replicas: Optional[int] = None,
                        shuffle: bool = True, drop_last: bool = False, epoch: int = 0, seed: int = 0) -> ev.SamplerInfo:
    """sampler info as the data probe records it for a DistributedSampler."""
    replicas = world_size if num_replicas is None else num_replicas
    if drop_last and dataset_len % replicas:
        num_samples = dataset_len // replicas
    else:
        num_samples = -(-dataset_len // replicas)
    return ev.SamplerInfo(type="DistributedSampler", distributed=True, batch_sampler="BatchSampler",
                          num_replicas=replicas, rank=rank, shuffle=shuffle, drop_last=drop_last, seed=seed,
                          epoch=epoch, num_samples=num_samples, total_size=num_samples * replicas)


def plain_sampler(type_: str = "RandomSampler") -> ev.SamplerInfo:
    return ev.SamplerInfo(type=type_, distributed=False, batch_sampler="BatchSampler", shuffle=type_ == "RandomSampler")


def distributed_shard(dataset_len: int, world_size: int, rank: int, *, num_replicas: Optional[int] = None,
                      drop_last: bool = False) -> list[int]:
    """What an unshuffled DistributedSampler gives ``rank`` (padding by wrapping around)."""
    replicas = world_size if num_replicas is None else num_replicas
    total = distributed_sampler(world_size, rank, dataset_len, num_replicas=replicas, drop_last=drop_last).total_size
    # torch pads by repeating the index list from its start, i.e. padded index i is i % dataset_len.
    return [i % dataset_len for i in range(rank, total, replicas)]


_DATASET_LEN = -1  # loader_pass: the sampler covers the whole dataset, as torch's own samplers say


def loader_pass(indices: list[int], *, loader: str = f"{SCRIPT}:12", number: int = 0, steps: Optional[int] = None,
                ddp_forwards: Optional[int] = None, sampler: Optional[ev.SamplerInfo] = None,
                dataset_len: Optional[int] = None, base_len: Optional[int] = None, domain: Optional[str] = None,
                complete: bool = True, batch_size: int = 1, drop_last: bool = False,
                num_batches: Optional[int] = None, order: Optional[str] = None, line: int = 12,
                final: bool = True, part: int = 0, keep: int = 64,
                dataset_digest: Optional[str] = None, population: Optional[int] = _DATASET_LEN) -> ev.LoaderPass:
    """A loader_pass event, in draw order. ``steps`` defaults to the number of batches (a training
    pass) and ``ddp_forwards`` to ``steps``; 0 = evaluation. ``final=False``: a part written while
    the pass was still open (then complete is False). ``dataset_digest``: the dataset's identity
    (different on ranks that built their own datasets). ``population``: what the sampler covers
    (default ``dataset_len``; None: unknown, a custom sampler)."""
    batches = -(-len(indices) // batch_size) if num_batches is None else num_batches
    steps = batches if steps is None else steps
    sampler = copy.copy(sampler or plain_sampler())
    sampler.population = dataset_len if population == _DATASET_LEN else population
    return ev.LoaderPass(loader=loader, number=number, part=part, final=final, complete=complete and final,
                         num_batches=batches, num_samples=len(indices), indices=encode_indices(indices),
                         order=order_hash(indices) if order is None else order, steps=steps,
                         ddp_forwards=steps if ddp_forwards is None else ddp_forwards,
                         sampler=sampler, site=site(line), batch_size=batch_size,
                         drop_last=drop_last, dataset_len=dataset_len, base_len=base_len or dataset_len,
                         dataset_type="TensorDataset", subset=domain is not None, domain=domain,
                         head=indices[:keep], tail=indices[-keep:], dataset_digest=dataset_digest)


# -- collectives / join ----------------------------------------------------------------------------

def collective(op: str, n: int, shape: Optional[list] = (4,), dtype: str = "float32", *, line: int = 60,
               group=None, t: Optional[float] = None, tensors: Optional[list] = None,
               rank_branch: bool = False, units: int = 1) -> ev.Collective:
    if tensors is None:
        tensors = [] if shape is None else [[list(shape), dtype]]
    return ev.Collective(t=float(n) if t is None else t, seq=n, op=op, n=n, tensors=tensors, group=group,
                         site=site(line), rank_branch=rank_branch, units=units)


def internal(first: int, count: int = 1, phase: str = "ddp-backward", *, line: int = 70, grad: Optional[bool] = None,
             training: Optional[bool] = None, ddp: Optional[int] = 0, t: Optional[float] = None,
             ops: Optional[list] = None, file: str = SCRIPT) -> ev.InternalCollectives:
    """Collectives a library (DDP) issued at numbers first .. first + count - 1, booked to ``line``."""
    if phase == "ddp-forward" and grad is None:
        grad = True
    return ev.InternalCollectives(t=float(first) if t is None else t, seq=first + count - 1, first=first, count=count,
                                  phase=phase, ddp=ddp, grad=grad, training=training, ops=list(ops or []),
                                  site=site(line, file=file))


def join(phase: str = "enter", line: int = 70) -> ev.JoinEvent:
    return ev.JoinEvent(phase=phase, site=site(line) if phase == "enter" else [])


def frame(line: int, *, user: bool, file: Optional[str] = None, function: str = "main", code: str = "") -> dict:
    return {"file": file or (SCRIPT if user else "/venv/torch/distributed/distributed_c10d.py"),
            "line": line, "function": function, "user": user, "code": code}


def heartbeat(rank: int, **fields) -> Heartbeat:
    return Heartbeat(pid=1000 + rank, rank=rank, **{"activity": "training", **fields})


def stop_snapshot(heartbeats: dict[int, dict], stacks: dict[int, list[dict]], *, reason: str = "hang",
                  threshold_s: float = 30.0, exited: Iterable[int] = (), missing: Iterable[int] = (),
                  signal: Optional[str] = None) -> StopSnapshot:
    """What the monitor records when it stops a job: each rank classified from its stack."""
    ranks: dict[int, RankState] = {}
    exited = set(exited)
    for rank, fields in heartbeats.items():
        beat = heartbeat(rank, **fields)
        if rank in exited:
            ranks[rank] = RankState(rank=rank, state="exited", heartbeat=beat, stalled_s=31.0)
            continue
        stack = stacks.get(rank, [])
        state, waiting_in = classify(stack, beat)
        ranks[rank] = RankState(rank=rank, state=state, waiting_in=waiting_in, heartbeat=beat, stack=stack,
                                stalled_s=31.0)
    for rank in missing:
        ranks[rank] = RankState(rank=rank, state="never started")
    return StopSnapshot(reason=reason, threshold_s=threshold_s, ranks=ranks, signal=signal)


# -- checkpoints -----------------------------------------------------------------------------------

def save(path: Optional[str], *, seq_start: int = 0, seq_end: Optional[int] = None,
         fingerprint: Optional[str] = "fp-A", module_prefix: bool = False, line: int = 80, nbytes: int = 1234,
         done: bool = True) -> ev.Save:
    """A finished torch.save, or (done=False) the event the probe writes as the save begins."""
    if not done:
        return ev.Save(seq=seq_start, path=path, seq_start=seq_start, seq_end=seq_start, site=site(line), done=False)
    return ev.Save(seq=seq_start, path=path, bytes=nbytes, seq_start=seq_start,
                   seq_end=seq_start if seq_end is None else seq_end, fingerprint=fingerprint,
                   module_prefix=module_prefix, site=site(line))


def load(path: Optional[str], *, seq_start: int = 0, map_location: Optional[str] = "cpu",
         existed: Optional[bool] = True, error: Optional[str] = None, line: int = 90) -> ev.Load:
    return ev.Load(seq=seq_start, path=path, existed=existed, seq_start=seq_start, map_location=map_location,
                   site=site(line), error=error)


def dcp(op: str = "save", path: Optional[str] = "/ckpt/dcp", line: int = 95) -> ev.DistributedCheckpoint:
    return ev.DistributedCheckpoint(op=op, path=path, site=site(line))


# -- sample content ---------------------------------------------------------------------------------

def content_pass(hashes: list[int], *, source: str = "loader", key: str = f"{SCRIPT}:12", number: int = 0,
                 feeds: Optional[str] = None, steps: Optional[int] = None, batch_rows: int = 32,
                 iterable: bool = True, dataset_type: str = "Stream", num_workers: int = 0, level: int = 0,
                 complete: bool = True, order: Optional[str] = None, line: int = 12,
                 sequence: Optional[list[int]] = None) -> ev.ContentPass:
    """A content_pass event of row hashes in feeding order (one part). ``steps`` defaults to the
    number of batches (a training pass, with as many DDP forwards); 0 = evaluation. ``sequence``:
    the rows recorded in feeding order (default: the first 1024, as the probe writes them; [] for
    evidence that did not record them)."""
    batches = -(-len(hashes) // batch_rows)
    steps = batches if steps is None else steps
    keep = min(1024, max(64, 2 * batch_rows))
    sequence = hashes[:1024] if sequence is None else sequence
    return ev.ContentPass(source=source, key=key, number=number, feeds=feeds, final=True, complete=complete,
                          dataset_type=dataset_type, iterable=iterable, num_workers=num_workers,
                          num_batches=batches, num_rows=len(hashes), batch_rows=batch_rows, level=level,
                          hashes=encode_indices(hashes), order=order_hash(hashes) if order is None else order,
                          head=hashes[:keep], tail=hashes[-keep:], steps=steps, ddp_forwards=steps,
                          site=site(line) if source == "loader" else [], sequence=sequence)
