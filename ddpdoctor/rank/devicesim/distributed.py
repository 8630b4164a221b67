"""NCCL becomes gloo; DDP's ``device_ids`` / ``output_device`` are dropped for CPU modules;
FSDP1's ``device_id`` becomes the CPU; single-process ``nn.DataParallel`` runs its module on the CPU.

After ``init_process_group("nccl")`` under simulation, ``dist.get_backend()`` honestly answers
"gloo": torch's own code (DDP, SyncBatchNorm, collectives) asks it to pick code paths, and gloo's
are the ones that run. The report's ``backend`` is "gloo" too; ``device_simulation`` says why.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any, Callable

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DataParallel, DistributedDataParallel

from ddpdoctor.rank.after_import import AfterImport
from ddpdoctor.rank.devicesim.ledger import DATA_PARALLEL, DDP_DEVICE_IDS, NCCL, Ledger
from ddpdoctor.rank.devicesim.mode import is_cuda
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder

PROBE = "device"


def gloo_backend(backend: Any, ledger: Ledger) -> Any:
    """The backend to use for ``backend``: anything naming NCCL (or nothing, which torch would resolve
    to "cuda:nccl" now that CUDA looks available) becomes gloo."""
    if backend is None:
        return "gloo"
    if "nccl" in str(backend).lower():
        ledger.count(NCCL)
        return "gloo"
    return backend


def _bound(original: Callable[..., Any], args: tuple, kwargs: dict) -> inspect.BoundArguments:
    return inspect.signature(original).bind_partial(*args, **kwargs)


def install(rec: Recorder, ledger: Ledger) -> Callable[[], None]:
    """Install the patches; returns what removes the import hook still waiting for FSDP (if any)."""
    def wrap_init(original):
        def init_process_group(*args, **kwargs):
            try:
                bound = _bound(original, args, kwargs)
            except TypeError:
                return original(*args, **kwargs)  # torch's own error for a bad call
            arguments = bound.arguments
            arguments["backend"] = gloo_backend(arguments.get("backend"), ledger)
            if is_cuda(arguments.get("device_id")):
                ledger.count("init_process_group(device_id=cuda)->none")
                arguments["device_id"] = None
            return original(*bound.args, **bound.kwargs)

        return init_process_group

    def wrap_new_group(original):
        def new_group(*args, **kwargs):
            try:
                bound = _bound(original, args, kwargs)
            except TypeError:
                return original(*args, **kwargs)
            if bound.arguments.get("backend") is not None:
                bound.arguments["backend"] = gloo_backend(bound.arguments["backend"], ledger)
            bound.arguments.pop("pg_options", None)  # NCCL options mean nothing to gloo
            return original(*bound.args, **bound.kwargs)

        return new_group

    for owner in (dist, c10d):
        patch(rec, PROBE, owner, "init_process_group", wrap_init)
        patch(rec, PROBE, owner, "new_group", wrap_new_group)

    def wrap_ddp_init(original):
        def __init__(self, module, *args, **kwargs):
            try:
                bound = _bound(original, (self, module, *args), kwargs)
            except TypeError:
                return original(self, module, *args, **kwargs)
            arguments = bound.arguments
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            if on_cpu and (arguments.get("device_ids") is not None or arguments.get("output_device") is not None):
                ledger.count(DDP_DEVICE_IDS)
                for device in arguments.get("device_ids") or []:
                    if isinstance(device, int):
                        ledger.device(device)
                arguments["device_ids"] = None
                arguments["output_device"] = None
            return original(*bound.args, **bound.kwargs)

        return __init__

    patch(rec, PROBE, DistributedDataParallel, "__init__", wrap_ddp_init)
    _install_data_parallel(rec, ledger)
    _install_device_mesh(rec, ledger)
    return _install_fsdp1_on_import(rec, ledger)


def _install_fsdp1_on_import(rec: Recorder, ledger: Ledger) -> Callable[[], None]:
    """FSDP1's patches once the script imports ``torch.distributed.fsdp``, never before: importing it
    is not free, and a process that imported it can deadlock at exit in torch 2.13 (its gloo process
    group, destroyed while a Python object sits in a pending work's thread-local state, waits for a
    thread that waits for the GIL); a script that never uses FSDP must not pay for it or risk that."""
    if FSDP_MODULE in sys.modules:
        _install_fsdp1(rec, ledger)
        return lambda: None

    def on_import(_module: Any) -> None:
        with rec.guard(PROBE, FSDP_MODULE):
            _install_fsdp1(rec, ledger)

    hook = AfterImport(FSDP_MODULE, on_import).insert()
    return hook.remove


def _install_data_parallel(rec: Recorder, ledger: Ledger) -> None:
    """``nn.DataParallel`` as a GPU machine runs it. It takes every simulated GPU of the node
    (``device_ids`` [0, 1...]) and, on GPUs, splits each batch over them, runs a replica per GPU and
    sums the gradients into the module: the same step as the module on the whole batch, which is
    what runs here (its scatter, replicate and gather are CUDA-only). Its check that the module sits
    on ``device_ids[0]`` has no CPU meaning: every simulated CUDA tensor is a CPU tensor."""

    def wrap_forward(original):
        def forward(self, *inputs, **kwargs):
            if not self.device_ids:
                return original(self, *inputs, **kwargs)
            ledger.count(DATA_PARALLEL)
            return self.module(*inputs, **kwargs)

        return forward

    patch(rec, PROBE, DataParallel, "forward", wrap_forward)


def _install_device_mesh(rec: Recorder, ledger: Ledger) -> None:
    try:
        import torch.distributed.device_mesh as device_mesh
    except ImportError:
        return

    def wrap(original):
        def init_device_mesh(device_type, *args, **kwargs):
            if device_type == "cuda":
                ledger.count("init_device_mesh(cuda)->cpu")
                device_type = "cpu"
            return original(device_type, *args, **kwargs)

        return init_device_mesh

    if hasattr(device_mesh, "init_device_mesh"):
        patch(rec, PROBE, device_mesh, "init_device_mesh", wrap)


FSDP_MODULE = "torch.distributed.fsdp"
FSDP1_DEVICE_ID = "FSDP device_id->cpu"
FSDP1_SYNC_STATES = "FSDP sync_module_states on cpu"
FSDP1_OFFLOAD = "FSDP state dict offload_to_cpu->in place"


def _install_fsdp1(rec: Recorder, ledger: Ledger) -> None:
    """``FullyShardedDataParallel(module, device_id=...)`` on the CPU. A GPU script passes its GPU
    (``local_rank``, ``torch.device("cuda", i)``, or nothing after ``torch.cuda.set_device``); FSDP1
    turns an index into ``torch.device(i)``, which a CPU build refuses ("Cannot access accelerator
    device when none is available"), and without one it refuses a CPU module ("FSDP needs a non-CPU
    accelerator device"). ``device_id=torch.device("cpu")`` is FSDP1's own CPU mode (gloo): the
    nested wrappers an auto-wrap policy builds inherit it from the root's arguments."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return
    import torch

    def wrap_init(original):
        def __init__(self, module, *args, **kwargs):
            try:
                bound = _bound(original, (self, module, *args), kwargs)
            except TypeError:
                return original(self, module, *args, **kwargs)
            arguments = bound.arguments
            device_id = arguments.get("device_id")
            if device_id is None or is_cuda(device_id):
                ledger.count(FSDP1_DEVICE_ID)
                if isinstance(device_id, int) and not isinstance(device_id, bool):
                    ledger.device(device_id)
                elif isinstance(device_id, torch.device) and device_id.index is not None:
                    ledger.device(device_id.index)
                arguments["device_id"] = torch.device("cpu")
            return original(*bound.args, **bound.kwargs)

        return __init__

    patch(rec, PROBE, FullyShardedDataParallel, "__init__", wrap_init)

    def kept_in_place(config: Any) -> Any:
        """The state-dict config without ``offload_to_cpu``: the tensors are on the CPU already, and
        FSDP1 "offloading" its CPU flat parameter frees the only copy (its unshard then reads a storage
        of size 0, or crashes in native code)."""
        if getattr(config, "offload_to_cpu", False) and dataclasses.is_dataclass(config):
            ledger.count(FSDP1_OFFLOAD)
            return dataclasses.replace(config, offload_to_cpu=False)
        return config

    def wrap_set_state_dict_type(original):
        def set_state_dict_type(*args, **kwargs):
            try:
                bound = _bound(original, args, kwargs)
            except TypeError:
                return original(*args, **kwargs)
            for name in ("state_dict_config", "optim_state_dict_config"):
                if bound.arguments.get(name) is not None:
                    bound.arguments[name] = kept_in_place(bound.arguments[name])
            return original(*bound.args, **bound.kwargs)

        return set_state_dict_type

    patch(rec, PROBE, FullyShardedDataParallel, "set_state_dict_type", wrap_set_state_dict_type)

    try:
        import torch.distributed.fsdp._init_utils as init_utils
    except ImportError:
        return

    def wrap_sync_check(original):
        def _check_module_states_for_sync_module_states(module_states):
            """``sync_module_states=True`` refuses CPU tensors (NCCL broadcasts none); every simulated
            GPU tensor is one, and gloo broadcasts them."""
            ledger.count(FSDP1_SYNC_STATES)

        return _check_module_states_for_sync_module_states

    if hasattr(init_utils, "_check_module_states_for_sync_module_states"):
        patch(rec, PROBE, init_utils, "_check_module_states_for_sync_module_states", wrap_sync_check)
