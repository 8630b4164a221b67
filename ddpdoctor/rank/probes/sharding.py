"""Probe on the data-parallel APIs other than the DistributedDataParallel class: FSDP2's
``fully_shard`` (HSDP when its mesh is 2-D), FSDP1's ``FullyShardedDataParallel`` and the composable
``replicate()`` (DDP's, and the FSDP2-based one where torch has it). Each is recorded once per call
site (``ShardedWrap``), at the user's line, with the mesh it shards over and the ranks that hold
this rank's shard (its replicate group): not-distributed then knows the job trains distributed,
gradient-sync compares HSDP's replicate-group peers, and the other checks that compare DDP
replicas say they do not judge a sharded model yet.

``fully_shard`` replaces each parameter of the module with a new DTensor parameter (FSDP1 with
``use_orig_params=False`` with its FlatParameters). The tensors it
replaced are remembered in :data:`REPLACED` (weakly, by identity: nothing is copied, and a tensor
nothing else holds is forgotten when it is collected), with the line of the call: an optimizer
built before ``fully_shard`` still holds them, and the optimizer probe says so at its first step.

``torch.distributed.fsdp`` and ``torch.distributed._composable`` are patched when the script
imports them (importing them costs a script that never does a good part of a CPU second), under
every name the function is exported as.
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ddpdoctor.rank import callsite
from ddpdoctor.rank.after_import import AfterImport
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.probes.sidetable import SideTable
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.events import ShardedWrap

PROBE = "sharding"
FSDP = "torch.distributed.fsdp"
COMPOSABLE = "torch.distributed._composable"
# (module, attribute, api): every module that exports a function under that name.
FUNCTIONS = (
    (FSDP, "fully_shard", "fully_shard"),
    (f"{FSDP}._fully_shard", "fully_shard", "fully_shard"),
    (f"{COMPOSABLE}.fsdp", "fully_shard", "fully_shard"),
    (f"{COMPOSABLE}.fsdp.fully_shard", "fully_shard", "fully_shard"),
    (COMPOSABLE, "replicate", "replicate"),
    (f"{COMPOSABLE}.replicate", "replicate", "replicate"),
    (f"{COMPOSABLE}.replicate_with_fsdp", "replicate", "replicate_with_fsdp"),
)
HYBRID_STRATEGIES = frozenset({"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"})

REPLACING = frozenset({"fully_shard", "replicate_with_fsdp"})  # the APIs that swap in DTensor parameters


@dataclass(frozen=True)
class Replaced:
    """A parameter that a sharding call replaced: the call, its name in the module handed to it, and
    the parameter that took its place (weakly)."""

    api: str
    site: list
    name: str
    shape: list[int]
    new: Optional[weakref.ref]


REPLACED: SideTable[Replaced] = SideTable()  # the replaced tensor -> how it was replaced

_inside = threading.local()  # depth of recorded calls: FSDP1's auto-wrapping builds nested instances


def install(rec: Recorder) -> Callable[[], None]:
    seen: set[tuple[str, str, int]] = set()  # (api, file, line) already recorded

    def record(api: str, module: Any, classes: str, mesh: Any, groups: Optional[list] = None,
               **fields: Any) -> None:
        site = callsite.caller_site()
        where = (api, site[0]["file"], site[0]["line"]) if site else (api, "", 0)
        if where in seen:
            return
        seen.add(where)
        modules = module if isinstance(module, (list, tuple)) else [module]
        mesh = mesh if mesh is not None else _mesh_of(modules)
        shape, dims = _mesh_info(mesh) if mesh is not None or groups is None else _groups_info(groups)
        hybrid = fields.pop("hybrid", False) or (api == "fully_shard" and len(shape) >= 2)
        peers = fields.pop("replicate_group", [])
        if mesh is not None and api != "replicate":
            peers = _replicate_group(mesh)
        rec.emit(ShardedWrap(api=api, module=classes, mesh_shape=shape, mesh_dims=dims, hybrid=hybrid,
                             site=site, replicate_group=peers, **fields))

    def wrap_function(api: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def wrapper(module: Any, *args: Any, **kwargs: Any) -> Any:
                classes = _classes(module)  # before the call: fully_shard swaps in its own class
                depth = getattr(_inside, "depth", 0)
                before = _named_parameters(module) if api in REPLACING and not depth else None
                _inside.depth = depth + 1
                try:
                    result = original(module, *args, **kwargs)
                finally:
                    _inside.depth = depth
                if not depth:
                    if before:
                        with rec.guard(PROBE, f"{api} parameters"):
                            _remember_replaced(api, before, _named_parameters(module))
                    with rec.guard(PROBE, api):
                        mesh = kwargs.get("mesh", kwargs.get("device_mesh"))
                        extra = {"reshard_after_forward": kwargs.get("reshard_after_forward")} \
                            if api == "fully_shard" else {}
                        world = [_world_group()] if api == "replicate" else None  # DDP over the world group
                        record(api, module, classes, mesh, world, **extra)
                return result

            return wrapper  # patch() copies the original's attributes (a contract's ``state``) onto it

        return make

    def wrap_fsdp1_init(original: Any) -> Any:
        def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            classes = _classes(module)
            depth = getattr(_inside, "depth", 0)
            before = _named_parameters(module) if not depth else None
            _inside.depth = depth + 1
            try:
                original(self, module, *args, **kwargs)
            finally:
                _inside.depth = depth
            if not depth:
                if before:  # use_orig_params=False: FlatParameters take the parameters' place
                    with rec.guard(PROBE, "FullyShardedDataParallel parameters"):
                        _remember_replaced("FullyShardedDataParallel", before, _named_parameters(self))
                with rec.guard(PROBE, "FullyShardedDataParallel.__init__"):
                    strategy = getattr(getattr(self, "sharding_strategy", None), "name", None)
                    hybrid = strategy in HYBRID_STRATEGIES
                    groups = [getattr(self, "_inter_node_pg", None)] if hybrid else []
                    groups.append(getattr(self, "process_group", None))  # the shard group, innermost
                    record("FullyShardedDataParallel", module, classes, kwargs.get("device_mesh"), groups,
                           hybrid=hybrid, sharding_strategy=strategy,
                           replicate_group=group_ranks(groups[0]) if hybrid else group_ranks(None))

        return __init__

    def patch_loaded() -> None:
        for module_name, attribute, api in FUNCTIONS:
            owner = sys.modules.get(module_name)
            if owner is not None and callable(getattr(owner, attribute, None)):
                patch(rec, PROBE, owner, attribute, wrap_function(api))
        fsdp = sys.modules.get(FSDP)
        if fsdp is not None and hasattr(fsdp, "FullyShardedDataParallel"):
            patch(rec, PROBE, fsdp.FullyShardedDataParallel, "__init__", wrap_fsdp1_init)

    hooks = []
    for name in (FSDP, COMPOSABLE):
        if name not in sys.modules:
            def on_import(_module: Any, name: str = name) -> None:
                with rec.guard(PROBE, name):
                    patch_loaded()

            hooks.append(AfterImport(name, on_import).insert())
    patch_loaded()

    def finish() -> None:
        for hook in hooks:
            hook.remove()

    return finish


def _named_parameters(module: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of ``module`` (of each module of a list, names prefixed by its position)."""
    if isinstance(module, (list, tuple)):
        return [(f"{i}.{name}", p) for i, m in enumerate(module) for name, p in _named_parameters(m)]
    named = getattr(module, "named_parameters", None)
    return list(named()) if callable(named) else []


def _remember_replaced(api: str, before: list[tuple[str, Any]], after: list[tuple[str, Any]]) -> None:
    """The parameters the call replaced (by identity): a name whose tensor is another one now."""
    now = dict(after)
    current = {id(p) for _, p in after}
    site: Optional[list] = None
    for name, old in before:
        if id(old) in current or old in REPLACED:
            continue
        if site is None:
            site = callsite.caller_site()
        new = now.get(name)
        try:
            ref = weakref.ref(new) if new is not None else None
        except TypeError:
            ref = None
        REPLACED.set(old, Replaced(api=api, site=site, name=name, shape=[int(n) for n in old.shape], new=ref))


def _classes(module: Any) -> str:
    modules = module if isinstance(module, (list, tuple)) else [module]
    return ", ".join(type(m).__name__ for m in modules)


def _mesh_of(modules: list) -> Optional[Any]:
    """The device mesh of the first DTensor parameter of ``modules`` (what fully_shard chose)."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None:
        return None
    for module in modules:
        for p in module.parameters():
            if isinstance(p, dtensor):
                return p.device_mesh
    return None


def _mesh_info(mesh: Any) -> tuple[list[int], list[str]]:
    if mesh is None:
        return [], []
    shape = [int(n) for n in getattr(mesh, "shape", ())]
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return shape, [str(n) for n in names] if names else [""] * len(shape)


def _replicate_group(mesh: Any) -> list[int]:
    """The global ranks that hold this rank's shard: its peers along the first (replicate) dimension
    of a mesh of two dimensions or more, itself alone on a 1-D mesh; [] when not known (this rank is
    not in the mesh)."""
    try:
        coordinate = mesh.get_coordinate()
        layout = mesh.mesh
        if coordinate is None:
            return []
        if len(coordinate) < 2:
            return [int(layout[tuple(coordinate)])]
        return [int(r) for r in layout[(slice(None), *coordinate[1:])].reshape(-1).tolist()]
    except (AttributeError, TypeError, IndexError, RuntimeError):
        return []


def group_ranks(group: Optional[Any]) -> list[int]:
    """The global ranks of a process group (FSDP1's replicate group); this rank alone for None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return []
    try:
        return [int(r) for r in dist.get_process_group_ranks(group)] if group is not None else [dist.get_rank()]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return []


def _world_group() -> Optional[Any]:
    dist = sys.modules.get("torch.distributed")
    return dist.group.WORLD if dist is not None and dist.is_initialized() else None


def _groups_info(groups: list) -> tuple[list[int], list[str]]:
    """FSDP1 without a mesh: the sizes of its process groups (replicate, shard), as a mesh's shape."""
    if any(group is None for group in groups):
        return [], []
    return [int(group.size()) for group in groups], [""] * len(groups)
