"""The evidence schema: every event kind a rank writes, with its fields, in one place.

Probes build these objects, the recorder writes them as JSON lines, the analysis loads them back
into the same classes, and the unit-test builders make them too, so the three cannot drift apart:
a misspelt field is a TypeError, not a silently missing value.

Every event carries the recorder's common fields: wall time ``t``, the global ``rank`` (None
before the process group exists), ``step`` (optimizer steps this process completed) and ``seq``
(the number of world-group collectives it had taken part in, DDP's own included where the backend
numbers them: see :class:`Collective`), which orders events across ranks through collectives.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Optional, TypeVar

__all__ = [
    "SCHEMA_VERSION", "EVENT_KINDS", "Event", "UnknownEvent", "SamplerInfo", "ProcessStart", "InitProcessGroup",
    "DestroyProcessGroup", "DDPWrap", "DataParallelWrap", "BufferFingerprint", "OptimizerInfo", "Step", "DDPUsage",
    "LoaderPass", "ShardedWrap", "LossWindow",
    "Collective", "JoinEvent", "Save", "Load", "DistributedCheckpoint", "ExceptionEvent", "SysExit", "Exit",
    "ProbeError", "RunCut", "DeviceSimulation", "event_from_json", "register_event",
    "RankEnvironment", "RankDevices", "CollectiveBenchmark",
    "ContentPass",
    "ConfigState", "ModeChange", "ParamGroupsWrite", "ModuleConversion", "DDPRewrap", "DDPBypass", "CommHook",
    "ContentPass", "InternalCollectives", "InternalPhase", "INTERNAL_PHASES", "UnchangedWeights", "Unfrozen",
]

SCHEMA_VERSION = 4  # 3: step fingerprints as encoded strings; 4: collectives numbered by the process group

Site = list[dict[str, Any]]  # innermost-first user frames: [{"file", "line", "function"}]
Frames = list[dict[str, Any]]  # outermost-first frames: [{"file", "line", "function", "code", "user"}]
Fingerprint = Optional[list[float]]  # [sum, norm] of one tensor, None for a missing tensor


# Types a field's value is written as it is (a nested record, an enum and the rest go through to_json's
# slower path): exact types, so that a subclass of one (a dataclass subclassing dict) takes that path too.
_JSON_TYPES = frozenset({type(None), bool, int, float, str, list, dict})


@dataclass(kw_only=True, slots=True)
class Event:
    """Fields every event carries; subclasses add their own and name their ``kind``."""

    kind: ClassVar[str] = ""
    nested: ClassVar[dict[str, type]] = {}  # field -> dataclass of a nested typed value
    omit_if_none: ClassVar[frozenset[str]] = frozenset()  # fields left out of the JSON line while None

    t: float = 0.0
    rank: Optional[int] = None
    step: int = 0
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name in _field_names(type(self)):  # type: ignore[arg-type]  # see _field_names
            value = getattr(self, name)
            if value is None and name in self.omit_if_none:
                continue
            # A plain value (almost every one) skips the dataclass test: a step writes several events.
            if type(value) not in _JSON_TYPES and dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)  # a nested record
            out[name] = value
        return out


@dataclass(kw_only=True, slots=True)
class UnknownEvent(Event):
    """An event of a kind this version does not know (a newer probe, a third-party plugin)."""

    kind_name: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.data, "kind": self.kind_name}


# kind -> event class: every kind registered with register_event, the built-in ones at import.
EVENT_KINDS: dict[str, type[Event]] = {}


EventT = TypeVar("EventT", bound=type[Event])


def register_event(cls: EventT) -> EventT:
    """Make an event kind load typed, not as an :class:`UnknownEvent` (a class decorator): a plugin's
    own kinds, and ddpdoctor's built-in ones below, which register the same way.

    ``cls`` is a ``@dataclass(kw_only=True, slots=True)`` subclass of :class:`Event` naming its own
    ``kind``, namespaced with a dot ("myplugin.thing") so it can never collide with a built-in kind.
    """
    if not (isinstance(cls, type) and issubclass(cls, Event) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass subclass of ddpdoctor's Event")
    kind = cls.__dict__.get("kind")
    builtin = cls.__module__ == __name__  # ddpdoctor's own kinds, registered the same way, are bare words
    if not isinstance(kind, str) or ("." not in kind.strip(".") and not builtin):
        raise ValueError(f"{cls.__qualname__} needs its own namespaced kind, e.g. kind: ClassVar[str] = "
                         f"\"myplugin.thing\" (got {kind!r})")
    if kind in EVENT_KINDS:
        taken = EVENT_KINDS[kind]
        raise ValueError(f"event kind {kind!r} is already registered by {taken.__module__}.{taken.__qualname__}")
    EVENT_KINDS[kind] = cls
    return cls


@dataclass(kw_only=True, slots=True)
class SamplerInfo:
    """What a DataLoader's (batch) sampler was when a pass started."""

    type: str = ""
    distributed: bool = False
    batch_sampler: Optional[str] = None
    num_replicas: Optional[int] = None
    rank: Optional[int] = None
    shuffle: bool = False
    drop_last: Optional[bool] = None
    seed: Optional[int] = None
    epoch: Optional[int] = None
    num_samples: Optional[int] = None
    total_size: Optional[int] = None
    # How many sample positions the sampler draws from, where it says: len(dataset) of a
    # DistributedSampler (a wrapped sampler's length under Lightning's DistributedSamplerWrapper),
    # len(indices) of a SubsetRandomSampler, len(data_source) of a Sequential/RandomSampler.
    # None: unknown (a custom sampler), and then no sample counts as never drawn.
    population: Optional[int] = None


# -- process lifecycle ------------------------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class ProcessStart(Event):
    kind: ClassVar[str] = "process_start"
    pid: int = 0
    host: str = ""
    local_rank: Optional[int] = None
    node_rank: Optional[int] = None
    world_size: Optional[int] = None
    fingerprint_every: int = 0
    schema_version: int = SCHEMA_VERSION
    python_version: str = ""
    torch_version: str = ""


@register_event
@dataclass(kw_only=True, slots=True)
class InitProcessGroup(Event):
    kind: ClassVar[str] = "init_pg"
    backend: str = ""
    world_size: int = 0
    numbering: str = "calls"  # "pg": collectives numbered by the backend (DDP's own included); "calls": traced calls
    local_rank: Optional[int] = None
    node_rank: Optional[int] = None
    host: str = ""
    pid: int = 0
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class DestroyProcessGroup(Event):
    kind: ClassVar[str] = "destroy_pg"
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class ExceptionEvent(Event):
    """The script (or a spawned worker) ended with an uncaught exception."""

    kind: ClassVar[str] = "exception"
    type: str = ""
    message: str = ""
    frames: Frames = field(default_factory=list)
    location: Optional[dict[str, Any]] = None  # innermost user frame {file, line}
    epoch: Optional[int] = None


@register_event
@dataclass(kw_only=True, slots=True)
class SysExit(Event):
    kind: ClassVar[str] = "sys_exit"
    code: int = 0
    location: Optional[dict[str, Any]] = None


@register_event
@dataclass(kw_only=True, slots=True)
class Exit(Event):
    kind: ClassVar[str] = "exit"
    code: Optional[int] = None


@register_event
@dataclass(kw_only=True, slots=True)
class RunCut(Event):
    """ddpdoctor stopped the script on purpose at a step or epoch boundary (--max-steps/--max-epochs)."""

    kind: ClassVar[str] = "cut"
    reason: str = ""  # "max-steps" | "max-epochs"
    at: int = 0


@register_event
@dataclass(kw_only=True, slots=True)
class ProbeError(Event):
    """A probe that failed while the script ran, or a patch that could not be applied."""

    kind: ClassVar[str] = "probe_error"
    probe: str = ""
    error: str = ""
    target: Optional[str] = None
    phase: str = "run"  # "install" (the patch did not apply) or "run"


@register_event
@dataclass(kw_only=True, slots=True)
class DeviceSimulation(Event):
    """What this process's device simulation (CUDA/NCCL on CPU, ddpdoctor.rank.devicesim) stood in for.

    Written when simulation is decided, then again (cumulative) each time a new kind of call is
    simulated and at exit, so the last event of a process holds its totals. ``calls``: what was
    simulated -> how many times ("nccl->gloo", "torch.cuda.set_device"...); ``unsupported``: calls
    that cannot be simulated (they raised in the script, or were ignored: ``ignored``); ``devices``:
    the CUDA device indices the script asked for; ``reason``: why the simulation is on or off (a GPU
    is visible, the launcher or framework chose the CPU, ``--device``).
    """

    kind: ClassVar[str] = "device_sim"
    mode: str = "auto"
    active: bool = False
    reason: str = ""
    calls: dict[str, int] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)


# -- DDP and optimizers -----------------------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class DDPWrap(Event):
    kind: ClassVar[str] = "ddp_wrap"
    ddp: int = 0
    params: list[str] = field(default_factory=list)  # names of parameters that require grad
    shapes: list[list[int]] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)
    find_unused_parameters: bool = False
    static_graph: bool = False
    broadcast_buffers: bool = True
    sync_batchnorm: bool = False
    device: str = "cpu"
    site: Site = field(default_factory=list)
    framework: Optional[str] = None  # who built this DDP: "accelerate", "lightning" (Trainer), "fabric"
    framework_version: Optional[str] = None
    # Parameters of the wrapped module that did not require grad when DDP was built: DDP's reducer
    # never takes them, so if they are unfrozen later their gradients are never averaged.
    frozen: list[str] = field(default_factory=list)
    # The global ranks of the process group DDP averages over (a sub-mesh's group under a 2-D mesh);
    # empty in evidence of earlier builds.
    group_ranks: list[int] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class DataParallelWrap(Event):
    """A model wrapped in single-process ``nn.DataParallel`` (once per call site): it splits each
    batch over this process's GPUs, and averages nothing across processes. ``device_ids`` as
    DataParallel resolved them (empty: no GPU, it just runs the module)."""

    kind: ClassVar[str] = "data_parallel"
    module: str = ""  # the wrapped module's class
    device_ids: list[int] = field(default_factory=list)
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class ShardedWrap(Event):
    """A model handed to a data-parallel API other than the DistributedDataParallel class (once per
    call site): FSDP2's ``fully_shard``, FSDP1's ``FullyShardedDataParallel``, the composable
    ``replicate()``. ``mesh_shape``/``mesh_dims``: the device mesh it shards (or replicates) over,
    outermost dimension first, its dimension names ("" where unnamed); empty when not known.
    ``hybrid``: HSDP, replicated across the first mesh dimension and sharded within the second (a
    2-D mesh given to fully_shard, FSDP1's HYBRID_SHARD strategies). ``replicate_group``: the global
    ranks that hold the same shard as this rank (its peers along the replicate dimension, itself
    included: only itself without one); empty when not known (older evidence, replicate())."""

    kind: ClassVar[str] = "sharded_wrap"
    api: str = ""  # "fully_shard", "FullyShardedDataParallel", "replicate", "replicate_with_fsdp"
    module: str = ""  # the wrapped module's class (classes, comma-separated, for a list of modules)
    mesh_shape: list[int] = field(default_factory=list)
    mesh_dims: list[str] = field(default_factory=list)
    hybrid: bool = False
    reshard_after_forward: Optional[int] = None  # as passed to fully_shard (True/False or an int); None: default
    sharding_strategy: Optional[str] = None  # FSDP1's ShardingStrategy name
    site: Site = field(default_factory=list)
    replicate_group: list[int] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class LossWindow(Event):
    """How the losses of one sampled optimizer step (its accumulation window) were weighted, for
    global-batch: each call of a probed loss function made with gradients (``calls``) and each
    mean-type node a backward reached without one (``means``), with the constant factor between it
    and the backward's root.

    ``calls``: [{"fn": "cross_entropy", "reduction": "mean"|"sum"|"none", "count": elements that
    contribute (targets not equal to ignore_index) or None, "numel": targets, "factor": the product
    of the scalar factors from the backward's root down to this loss (a division by 4 is 0.25; None:
    no backward reached it, or not through scalars only), "elementwise": reached through an
    elementwise (non-scalar) factor such as a mask, "site": the user's line}].
    ``means``: [{"node": "mean"|"mse_loss"|..., "factor", "site": the backward's line}].
    ``backwards``: backward passes in the window; ``scaled``: a GradScaler's scale was divided out.
    """

    kind: ClassVar[str] = "loss_window"
    step: int = 0  # the (1-based) step of the optimizer that closed the window
    backwards: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    means: list[dict[str, Any]] = field(default_factory=list)
    scaled: bool = False
    backward_at: Site = field(default_factory=list)  # the user's line of the window's first backward
    # The first line from the loss call to that backward (same file) that scales by a name of the world size
    # (``/ world_size``, ``* dist.get_world_size()``); empty when none does.
    scaling_at: Site = field(default_factory=list)
    # Samples of the DDP modules' local gradients (before DDP's all-reduce) as each backward of the window
    # left them, accumulated: [[ddp, parameter position, coordinates]...] and, per backward in order, the
    # values in that layout (the first coordinates of each parameter). Empty when not taken.
    grad_layout: list[list[int]] = field(default_factory=list)
    grad_samples: list[list[float]] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class BufferFingerprint(Event):
    """Buffers of one DDP module at a synchronized training forward (after DDP's broadcast)."""

    kind: ClassVar[str] = "buffers"
    ddp: int = 0
    forward: int = 0
    fp: list[Fingerprint] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class OptimizerInfo(Event):
    """An optimizer's parameters, written at its first step."""

    kind: ClassVar[str] = "optimizer"
    opt: int = 0
    type_name: str = ""
    names: list[str] = field(default_factory=list)
    in_ddp: list[bool] = field(default_factory=list)  # per parameter: inside a DDP-wrapped module
    ddp_of: list[Optional[int]] = field(default_factory=list)  # per parameter: index of its DDP module, or None
    shapes: list[list[int]] = field(default_factory=list)
    site: Site = field(default_factory=list)
    # Where the optimizer was constructed (``site`` is where it first stepped); from which of its own
    # steps this description holds (written again when param groups are added); parameters per group.
    built_at: Site = field(default_factory=list)
    n: int = 1
    group_sizes: list[int] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)  # per parameter, "torch.float32"...
    # Per parameter: the DDP module whose wrapped module holds it although DDP does not (it was frozen
    # when DDP was built), else None. Empty in evidence of earlier builds.
    frozen_in: list[Optional[int]] = field(default_factory=list)
    # Its state before its first step: where `load_state_dict` restored it (empty: never), how many
    # parameters had state, and the largest step count in it (None: no step counter, or no state).
    # Ranks that resume must all restore it, or their updates differ from the first step.
    loaded_at: Site = field(default_factory=list)
    state_entries: int = 0
    state_step: Optional[float] = None


@register_event
@dataclass(kw_only=True, slots=True)
class ReplacedParams(Event):
    """An optimizer that, where it is described (``OptimizerInfo`` at step ``n``), holds tensors a
    sharding call (``api``: ``fully_shard``) replaced with new parameters after the optimizer took
    them: built before the call, it steps tensors that are no longer the model's. ``positions`` in
    its parameter list, their ``names`` (the parameters that took their place, as the model names
    them) and ``shapes`` before sharding; ``sites``: the calls that replaced them, in order."""

    kind: ClassVar[str] = "replaced_params"
    opt: int = 0
    n: int = 1
    api: str = ""
    positions: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class Step(Event):
    """One optimizer step. ``grads``/``params`` are fingerprints on sampled steps only.

    ``forwards``: for each DDP module owning parameters of this optimizer, the training forwards
    since this optimizer's previous step: {"synced", "unsynced" (inside no_sync), "inner" (the
    wrapped module's own forward, which also runs when DDP is bypassed)}.
    """

    kind: ClassVar[str] = "step"
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"config", "touched", "reduced", "written"})
    opt: int = 0
    n: int = 0
    grads: Optional[str] = None  # encoded fingerprints (schema/fingerprints.py), None when not sampled
    params: Optional[str] = None
    forwards: dict[str, dict[str, int]] = field(default_factory=dict)
    closure: bool = False  # stepped with a closure: gradients were read after the step
    # On sampled steps: a digest of what must agree across ranks (ConfigState holds the detail);
    # how many gradients changed between the end of DDP's all-reduce and the step, by their sampled
    # fingerprints (None: not known); the gradients' sampled fingerprints as the all-reduce left
    # them (rank/fingerprint.py; a gradient DDP does not reduce: its sampled value before the step),
    # comparable across ranks, not with ``grads``. Evidence from earlier builds has ``reduced``
    # only where ``touched`` is not 0, as full fingerprints.
    config: Optional[str] = None
    touched: Optional[int] = None
    reduced: Optional[str] = None
    # Parameters written outside the optimizer since its previous step (their version counters moved:
    # a load_state_dict, a copy_, a clamp): their fingerprints before this step, None for the others.
    written: Optional[str] = None
    # [seconds waited in DataLoader.__next__ since the previous step, then how many seconds before
    # ``t`` the first DDP forward, the first gradient, the last gradient and the optimizer's step
    # began] (None where not seen): the step's phases for the timeline and --trace.
    timing: Optional[list[Optional[float]]] = None


@register_event
@dataclass(kw_only=True, slots=True)
class UnchangedWeights(Event):
    """Parameters an optimizer step left bit-for-bit unchanged although they had a non-zero gradient
    (their fingerprint equals the previous fingerprinted step's), measured right after that step so
    the analysis can tell why instead of guessing (each parameter a few times per run at most).

    ``params``: position in the optimizer -> [gradient RMS, update ratio]: the largest, over the
    tensor's elements, of the update this optimizer's step applies (learning rate times its step
    direction: Adam's bias-corrected m/(sqrt(v)+eps), SGD's momentum buffer or gradient, decoupled
    weight decay) divided by the spacing of the weight's dtype at the element's value. Below 1 the
    update rounds away; None where the optimizer's rule is not known. ``grad_rms_median``: the median
    gradient RMS over the optimizer's parameters with a gradient, against which a gradient is
    negligible (a bias before a norm layer, whose gradient is mathematically zero).
    """

    kind: ClassVar[str] = "unchanged_weights"
    opt: int = 0
    n: int = 0
    params: dict[str, list[Optional[float]]] = field(default_factory=dict)
    grad_rms_median: Optional[float] = None


@register_event
@dataclass(kw_only=True, slots=True)
class DDPUsage(Event):
    """Which parameters of one DDP module got no gradient, per synchronized iteration.

    An iteration runs from a synchronized training forward to the next forward of the same
    module and counts only if its backward produced a gradient. Cumulative: the last event of a
    rank holds the totals. ``last_unused`` is the iteration that just closed (written at once
    when it left parameters without gradient, before DDP can raise about it).
    """

    kind: ClassVar[str] = "ddp_usage"
    ddp: int = 0
    iterations: int = 0
    backwards: Optional[int] = None  # backward passes DDP synchronized, the one still running included
    unused: dict[str, int] = field(default_factory=dict)  # str(param index) -> iterations without gradient
    last_unused: list[int] = field(default_factory=list)
    final: bool = False


# -- data -------------------------------------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class LoaderPass(Event):
    """One part of one rank's pass (epoch) over one DataLoader.

    A pass is written in parts as it goes (after each of its first batches, then about once a
    second, and when it ends), so a rank that is killed loses at most a second of it. ``indices``
    are the part's own draws, as positions in the base dataset (under any Subset); the counters,
    ``order`` (a digest of the draw order so far) and ``tail`` are cumulative; ``head`` holds the
    pass's first draws. ``final``: the pass ended (``complete``: the loader was exhausted).
    ``dataset_len`` is the length of what the sampler samples, ``base_len`` of the dataset under
    every Subset, ``domain`` a digest of the Subset's positions (None without a Subset),
    ``dataset_digest`` a digest of what the dataset under every Subset holds (its type, length and
    attributes, never its items): ranks that built the same dataset have the same one, so a
    position names the same sample on each (None: not read).
    """

    kind: ClassVar[str] = "loader_pass"
    nested: ClassVar[dict[str, type]] = {"sampler": SamplerInfo}
    loader: str = ""
    number: int = 0
    part: int = 0
    final: bool = True
    complete: bool = False
    num_batches: int = 0
    num_samples: Optional[int] = None
    indices: Optional[str] = None
    order: Optional[str] = None
    steps: int = 0
    ddp_forwards: int = 0
    sampler: SamplerInfo = field(default_factory=SamplerInfo)
    site: Site = field(default_factory=list)
    batch_size: Optional[int] = None
    drop_last: bool = False
    num_workers: int = 0
    dataset_len: Optional[int] = None
    base_len: Optional[int] = None
    dataset_type: str = ""
    subset: bool = False
    domain: Optional[str] = None
    head: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)
    # batches the batch sampler skips before it yields (a resumed epoch: Accelerate's SkipBatchSampler)
    skipped_batches: int = 0
    dataset_digest: Optional[str] = None


@register_event
@dataclass(kw_only=True, slots=True)
class ContentPass(Event):
    """Fingerprints of the samples one rank fed in one pass, written in parts as it goes.

    ``source`` "loader": a DataLoader's collated batches over one pass (``key`` as LoaderPass's
    ``loader``, ``number`` its pass number); "forward": the first tensor argument of a DDP module's
    training forwards, in windows of consecutive forwards (``key`` "ddp<i>", ``number`` the window,
    ``feeds`` the open loader pass "key#number" the batches came from, None without one). ``hashes``
    are this part's kept row hashes (63-bit, sorted, encoded as sample indices are): a row is kept
    while ``hash >> (63 - level)`` is 0, and ``level`` (cumulative) rises when a pass keeps too many,
    so the same rows are kept on every rank. ``order`` digests every row hash in order (cumulative);
    ``head``/``tail`` are the first and last rows' hashes; counters are cumulative. Forward windows
    also carry a digest of each forward's whole batch (``digests``, from forward ``first_forward``
    on), so identical batches fed at the same training step on several ranks show however few rows
    a batch has.
    """

    kind: ClassVar[str] = "content_pass"
    source: str = "loader"
    key: str = ""
    number: int = 0
    part: int = 0
    final: bool = True
    complete: bool = False
    feeds: Optional[str] = None
    dataset_type: str = ""
    iterable: bool = False
    num_workers: int = 0
    epoch: Optional[int] = None
    num_batches: int = 0
    num_rows: int = 0
    batch_rows: int = 0
    level: int = 0
    hashes: str = ""
    order: str = ""
    head: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)
    steps: int = 0
    ddp_forwards: int = 0
    site: Site = field(default_factory=list)
    set_epoch_method: Optional[bool] = None  # "loader": the dataset defines set_epoch (it means to vary by epoch)
    dataset_epoch: Optional[int] = None  # "loader": the dataset's own epoch attribute when the pass started
    declares_shuffle: Optional[bool] = None  # "loader": the dataset says it shuffles (a `shuffle` flag, HF's shuffling)
    first_forward: Optional[int] = None  # "forward" windows: the module's training forward (1-based) of digests[0]
    # "forward" windows, this part: one digest per forward's whole batch (prefixed "s:" when the input
    # was not the feeding loader's batch as yielded: made in the script)
    digests: list[str] = field(default_factory=list)
    # This part's kept row hashes in the order they were fed (``hashes`` holds them sorted), until the
    # pass has given 1024 of them: whether the rows two ranks share came in the same order.
    sequence: list[int] = field(default_factory=list)


# -- collectives --------------------------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class Collective(Event):
    """A user-level torch.distributed call. ``group``: None for the world group, else its ranks.

    ``n`` is the call's number on its group. Where the backend numbers its collectives (gloo and
    NCCL do: the flight recorder's ``collective_seq_id``), ``n`` counts every collective the rank
    took part in on that group, DDP's own included (see :class:`InternalCollectives`): a call that
    issues several (``all_gather_object``: 2) is ``n`` .. ``n + units - 1``; point-to-point calls take
    no number (``units`` 0). Elsewhere ``n`` counts the traced calls.

    ``phase``: set where a library made the call on the user's behalf (an :class:`InternalPhase`:
    FSDP's parameter all-gather and gradient reduce-scatter); ``site`` is then the user's line that
    caused it (the forward, ``loss.backward()``). None for the script's own calls.
    """

    kind: ClassVar[str] = "collective"
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"phase"})
    op: str = ""
    n: int = 0
    tensors: list[list[Any]] = field(default_factory=list)  # [[shape], dtype] of each tensor argument, up to 8
    group: Any = None
    site: Site = field(default_factory=list)
    rank_branch: bool = False
    units: int = 1  # collectives the call issued on its group, as numbered by ``n``
    pg_seq: Optional[int] = None  # the backend's sequence number of its first collective (flight recorder id)
    phase: Optional[str] = None  # an InternalPhase when a library (FSDP) made the call; None: the script's own


class InternalPhase(str, Enum):
    """What issued collectives no traced call made (:attr:`InternalCollectives.phase`), as the rank's
    clock names it and a flight recorder dump's stack shows it. A ``str`` enum:
    ``InternalPhase.DDP_INIT == "ddp-init"``, and JSON writes "ddp-init"."""

    DDP_INIT = "ddp-init"  # the constructor's broadcasts
    DDP_FORWARD = "ddp-forward"  # buffer broadcast, first-iteration bucket rebuild
    DDP_BACKWARD = "ddp-backward"  # gradient bucket all-reduces, the find_unused_parameters bitmap
    FSDP_FORWARD = "fsdp-forward"  # FSDP's parameter all-gather before a forward (traced calls: Collective.phase)
    FSDP_BACKWARD = "fsdp-backward"  # FSDP's all-gather before a backward, its gradient reduce-scatter (all-reduce)
    FSDP_STATE_DICT = "fsdp-state-dict"  # FSDP1 gathering a model's or optimizer's state dict
    OTHER = "other"  # anything else: Join's shadow collectives, comm libraries

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its value, so "ddp-init" finds InternalPhase.DDP_INIT in a dict
        return hash(self.value)

    @property
    def is_ddp(self) -> bool:
        return self.value.startswith("ddp-")

    @property
    def is_fsdp(self) -> bool:
        return self.value.startswith("fsdp-")

    @property
    def words(self) -> str:
        """In a few words (the live view, the timeline): "DDP's forward broadcast"."""
        return _PHASE_TEXT[self.value][0]

    @property
    def what(self) -> str:
        """In a finding's sentence: "DDP's forward (its buffer or bucket broadcast)"."""
        return _PHASE_TEXT[self.value][1]

    @property
    def part_of(self) -> str:
        """What a collective it issued is part of, after "in" ("all_reduce in DDP's gradient all-reduce")."""
        return _PHASE_TEXT[self.value][2]


# Each phase's words, in the three places people read them (see InternalPhase.words, .what, .part_of).
_PHASE_TEXT = {
    "ddp-init": ("DDP's constructor broadcast", "DDP's constructor (broadcast of the parameters from rank 0)",
                 "DDP's constructor (parameter broadcast)"),
    "ddp-forward": ("DDP's forward broadcast", "DDP's forward (its buffer or bucket broadcast)",
                    "DDP's forward (its buffer or bucket broadcast)"),
    "ddp-backward": ("DDP's gradient all-reduce", "DDP's gradient all-reduce in the backward pass",
                     "DDP's gradient all-reduce"),
    "fsdp-forward": ("FSDP's forward all-gather", "FSDP's forward (the all-gather of a sharded module's parameters)",
                     "FSDP's forward"),
    "fsdp-backward": ("FSDP's backward all-gather or reduce-scatter",
                      "FSDP's backward (the parameters' all-gather, the gradients' reduce-scatter)",
                      "FSDP's backward"),
    "fsdp-state-dict": ("FSDP's state-dict gather", "FSDP's state-dict gathering (of the model or the optimizer)",
                        "FSDP's state-dict gathering"),
    "other": ("a library's collective", "a collective no traced call made", "a library's collective"),
}
INTERNAL_PHASES = tuple(p.value for p in InternalPhase)
# FSDP1's modules that gather a model's or optimizer's state dict: a collective called under one of them
# is FSDP's state-dict gathering (its unshard uses the same all-gather as a forward's), live and post-mortem.
FSDP_STATE_DICT_FILES = ("_state_dict_utils.py", "_optim_utils.py", "_unshard_param_utils.py")
# DDP's own collectives by InternalCollectives.phase, in a few words (the live view and the timeline).
DDP_PHASE_WORDS = {p.value: p.words for p in InternalPhase if p.is_ddp}


@register_event
@dataclass(kw_only=True, slots=True)
class InternalCollectives(Event):
    """Collectives on the world group that a library issued without a traced torch.distributed call.

    They hold positions ``first`` .. ``first + count - 1`` of the rank's collective numbering (the
    numbering of :attr:`Collective.n`), so a rank's whole sequence is known, DDP's own part included.
    ``site``: the user's line that caused them (the DDP forward, ``loss.backward()``, the constructor);
    ``grad``: whether a DDP forward prepared a backward (grad enabled, outside ``no_sync``); ``ops``:
    [op, [[shape], dtype]] per collective where known (a flight recorder dump), else empty.
    """

    kind: ClassVar[str] = "internal_collectives"
    first: int = 0
    count: int = 0
    phase: str = "other"  # an InternalPhase
    ddp: Optional[int] = None
    grad: Optional[bool] = None
    training: Optional[bool] = None
    group: Any = None
    ops: list[list[Any]] = field(default_factory=list)
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class JoinEvent(Event):
    kind: ClassVar[str] = "join"
    phase: str = "enter"
    site: Site = field(default_factory=list)


# -- checkpoints --------------------------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class Save(Event):
    kind: ClassVar[str] = "save"
    path: Optional[str] = None
    bytes: Optional[int] = None
    seq_start: int = 0
    seq_end: int = 0
    fingerprint: Optional[str] = None
    module_prefix: bool = False
    site: Site = field(default_factory=list)
    dur_s: Optional[float] = None  # how long torch.save took (``t`` is when it returned)
    # False: written as torch.save begins, so a save that a kill interrupts is still in the evidence;
    # the finished save is its own event (done=True) with the same path and seq_start.
    done: bool = True


@register_event
@dataclass(kw_only=True, slots=True)
class Load(Event):
    kind: ClassVar[str] = "load"
    path: Optional[str] = None
    existed: Optional[bool] = None
    seq_start: int = 0
    map_location: Optional[str] = None
    site: Site = field(default_factory=list)
    error: Optional[str] = None
    module_prefix: bool = False


@register_event
@dataclass(kw_only=True, slots=True)
class DistributedCheckpoint(Event):
    kind: ClassVar[str] = "dcp"
    op: str = ""
    path: Optional[str] = None
    site: Site = field(default_factory=list)


# -- environment and the smoke test ---------------------------------------------------------------

@register_event
@dataclass(kw_only=True, slots=True)
class RankEnvironment(Event):
    """What a rank runs on, recorded at start-up without initializing CUDA (that would poison a later
    fork): versions, the NVIDIA driver, and the variables that steer a distributed job."""

    kind: ClassVar[str] = "environment"
    host: str = ""
    pid: int = 0
    local_rank: Optional[int] = None
    node_rank: Optional[int] = None
    python_version: str = ""
    torch_version: str = ""
    platform: str = ""
    cuda_version: Optional[str] = None  # torch.version.cuda: the CUDA torch was built with
    cudnn_version: Optional[int] = None
    nccl_version: Optional[str] = None
    driver_version: Optional[str] = None
    variables: dict[str, str] = field(default_factory=dict)  # NCCL_*, CUDA_VISIBLE_DEVICES, MASTER_ADDR...


@register_event
@dataclass(kw_only=True, slots=True)
class RankDevices(Event):
    """The GPUs a rank saw and the one it used, written when the script ends, only if the script
    itself initialized CUDA. ``gpus``: [{index, name, memory_bytes, uuid, pci_bus_id}] of the visible
    devices; ``current_device``: torch.cuda.current_device() at the end."""

    kind: ClassVar[str] = "devices"
    gpus: list[dict[str, Any]] = field(default_factory=list)
    current_device: Optional[int] = None
    driver_version: Optional[str] = None


@register_event
@dataclass(kw_only=True, slots=True)
class CollectiveBenchmark(Event):
    """One rank's timings of the reference job's collective sweep. ``rows``: [{op, bytes, time_us}],
    ``time_us`` this rank's mean time per call; ``bytes`` as nccl-tests count them (the whole
    buffer: all_reduce's tensor, all_gather's output, reduce_scatter's input)."""

    kind: ClassVar[str] = "collective_benchmark"
    backend: str = ""
    device: str = ""
    world_size: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    iterations: dict[str, int] = field(default_factory=dict)  # {"warmup": n, "timed": n}
    skipped: list[dict[str, str]] = field(default_factory=list)  # [{op, reason}]


# -- training configuration: config-sync, optimizer-params, causes of divergence --------------------

@register_event
@dataclass(kw_only=True, slots=True)
class ConfigState(Event):
    """What must agree across ranks for the steps of one optimizer, written when its digest
    (``Step.config``) changes on this process: the detail that explains a mismatch.

    ``groups``: per param group, every number and flag (``params`` left out); ``modules``: per DDP
    module it steps (str index) {"count", "eval": {type: n}, "flips": [[name, type, training]]
    where a module's mode differs from its parent's (the wrapper counts as the parent of the root)};
    ``frozen``: per DDP module {"count", "frozen", "names": module prefixes or names}; ``autocast``:
    per DDP module [enabled, dtype] at its last training forward; ``scale``: a GradScaler's scale.
    """

    kind: ClassVar[str] = "config"
    opt: int = 0
    n: int = 0
    digest: str = ""
    groups: list[dict[str, Any]] = field(default_factory=list)
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    frozen: dict[str, dict[str, Any]] = field(default_factory=dict)
    autocast: dict[str, list[Any]] = field(default_factory=dict)
    scale: Optional[float] = None


@register_event
@dataclass(kw_only=True, slots=True)
class ModeChange(Event):
    """``Module.train()``/``eval()`` changed a module's mode: once per call site, mode and module.
    ``ddp``/``name``: the DDP module it belongs to and its name there ("" the wrapped module,
    "(wrapper)" the DDP wrapper), None when it is not inside a DDP module (yet)."""

    kind: ClassVar[str] = "mode_change"
    ddp: Optional[int] = None
    name: Optional[str] = None
    type_name: str = ""
    training: bool = True
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class ParamGroupsWrite(Event):
    """An optimizer's hyperparameters changed before its step ``n``: once per optimizer, keys and
    writers. ``sites``: the candidate writers since the previous step, each with its ``via``:
    "scheduler" (an LR scheduler's step was called there) or "param_groups" (user code read
    ``optimizer.param_groups`` there, the writer among them); ``via``: the first one's, "unknown"
    without any; ``keys``: [[group, key]] that changed."""

    kind: ClassVar[str] = "param_groups_write"
    opt: int = 0
    n: int = 0
    keys: list[list[Any]] = field(default_factory=list)
    via: str = ""
    sites: list[dict[str, Any]] = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class ModuleConversion(Event):
    """A DDP module (or a module inside one) converted or moved after wrapping: ``method`` of
    ``nn.Module`` ("to", "half", "float", "cpu", "cuda"...), ``target`` what it asked for;
    ``swapped``: its parameters got new storage (DDP's hooks and buckets still hold the old);
    ``device_move``: it asked for a device. Once per call site and method."""

    kind: ClassVar[str] = "module_conversion"
    ddp: int = 0
    method: str = ""
    target: str = ""
    device_move: bool = False
    swapped: bool = False
    dtype_before: str = ""
    dtype_after: str = ""
    device_before: str = ""
    device_after: str = ""
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class DDPRewrap(Event):
    """DistributedDataParallel constructed (as DDP module ``ddp``) around a module that DDP module
    ``previous`` already wraps."""

    kind: ClassVar[str] = "ddp_rewrap"
    ddp: int = 0
    previous: int = 0


@register_event
@dataclass(kw_only=True, slots=True)
class DDPBypass(Event):
    """A forward of the wrapped module with gradients enabled that did not go through its DDP
    wrapper (``model.module(x)``): once per DDP module and call site. ``forwards``: such forwards
    of that module so far."""

    kind: ClassVar[str] = "ddp_bypass"
    ddp: int = 0
    forwards: int = 0
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class Unfrozen(Event):
    """Parameters that were frozen when DDP module ``ddp`` was built, made trainable again:
    ``call`` is how ("requires_grad_", "add_param_group"), once per call site."""

    kind: ClassVar[str] = "unfrozen"
    ddp: int = 0
    names: list[str] = field(default_factory=list)
    call: str = ""
    site: Site = field(default_factory=list)


@register_event
@dataclass(kw_only=True, slots=True)
class CommHook(Event):
    """A communication hook registered on a DDP module (``register_comm_hook``)."""

    kind: ClassVar[str] = "comm_hook"
    ddp: Optional[int] = None
    name: str = ""
    module: str = ""
    site: Site = field(default_factory=list)


# Callers pass an Event class, which mypy takes for unhashable (a dataclass with eq= sets its
# instances' __hash__ to None), so their calls carry type: ignore[arg-type]: the class itself hashes.
@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _known_fields(data: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """``data`` without the keys ``names`` lacks ("kind", fields of a newer writer): set operations
    in C, since a thousand-rank job's evidence is millions of lines."""
    values = dict(data)
    for key in values.keys() - names:
        del values[key]
    return values


def event_from_json(data: dict[str, Any], *, owned: bool = False) -> Event:
    """The typed event for one JSON line; unknown fields are dropped, unknown kinds kept as data.

    ``owned``: ``data`` was parsed for this call alone and may be consumed (no copy: a thousand-rank
    job's evidence is millions of lines)."""
    cls = EVENT_KINDS.get(data.get("kind", ""))
    if cls is None:
        return UnknownEvent(kind_name=str(data.get("kind")), data=data, t=float(data.get("t") or 0.0),
                            rank=data.get("rank"))
    if owned and not cls.nested:  # the common case: a line this version wrote, built without a key check
        kind = data.pop("kind")
        try:
            return cls(**data)
        except TypeError:  # a field of a newer writer: drop what this version does not know
            data["kind"] = kind
    names = _field_names(cls)  # type: ignore[arg-type]  # see _field_names
    if owned:
        values = data
        for key in values.keys() - names:  # "kind", and fields of a newer writer
            del values[key]
    else:
        values = _known_fields(data, names)
    for name, nested_cls in cls.nested.items():
        if isinstance(values.get(name), dict):
            values[name] = nested_cls(**_known_fields(values[name], _field_names(nested_cls)))
    return cls(**values)


