"""What a rank is doing, read from its main thread's Python stack: one set of rules for both sides.

The monitor classifies a *stalled* rank with :func:`classify` (waiting in communication, busy in a
library, computing in the user's code) to decide whether the job is hung; every rank's watchdog
classifies its own stack at each heartbeat with :func:`live_state`, so the live view says what the
rank really does (computing; waiting in all_reduce #5; loading data; saving a checkpoint) instead of
the last thing a probe happened to note. Pure functions of the stack: no torch, no I/O.

A stack is a list of frames, outermost first: ``{"file", "line", "function", "code", "user"}``
(``code`` may be empty; only DDP's own frames need it).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["classify", "live_state", "in_backward", "DDP_FILE", "STATES", "DDP_GRADIENT_ALLREDUCE"]

DDP_FILE = "torch/nn/parallel/distributed.py"
# (function or code fragment in DDP's own frames, what the rank waits in), most specific first.
_DDP_WAITS = (
    ("_rebuild_buckets", "DDP's first-iteration bucket rebuild (a broadcast of the bucket order from rank 0)"),
    ("_sync_buffers", "DDP's buffer broadcast"),
    ("_sync_module_buffers", "DDP's buffer broadcast"),
    ("_default_broadcast_coalesced", "DDP's buffer broadcast"),
    ("_check_global_requires_backward_grad_sync", "Join's check of which ranks still train"),
    ("_verify_param_shape_across_processes", "DDP's constructor (checking parameter shapes across ranks)"),
    ("_sync_params_and_buffers", "DDP's constructor (broadcasting parameters from rank 0)"),
    ("__init__", "DDP's constructor"),
)
_IMPORTLIB = "<frozen importlib"  # the import system's frames: <frozen importlib._bootstrap(_external)>
_KNOWN_BUSY = (
    ("torch/utils/data", "the DataLoader (waiting for a batch)"),
    ("torch/serialization.py", "torch.save / torch.load"),
    ("torch/distributed/checkpoint", "torch.distributed.checkpoint"),
)
# ddpdoctor's own frames a stalled rank can be found in, by function, in the words of what the script
# called: the ddp probe imports torch._dynamo (which DDP's constructor imports anyway) and collects
# what the import left, before the constructor runs.
_PROBE_BUSY = (("_import_dynamo_quietly", "DDP's constructor (importing torch._dynamo)"),)
BACKWARD = "the backward pass (DDP's gradient all-reduce)"
# The backward's entry points: while autograd's engine runs a backward (on this thread on the CPU, on
# its own threads on a GPU) the main thread sits in one of these. Not any frame under torch/autograd:
# `torch/autograd/function.py apply` is also a custom Function's *forward* (a DTensor redistribute
# inside get_model_state_dict, FSDP's own functions), which runs no backward.
_AUTOGRAD_DIR = "torch/autograd/"
_AUTOGRAD_API = "torch/autograd/__init__.py"  # torch.autograd.backward / grad and their helpers
_TENSOR_FILE = "torch/_tensor.py"  # Tensor.backward
_BACKWARD_FUNCTIONS = frozenset({"backward", "grad", "_engine_run_backward", "_make_grads"})
DDP_GRADIENT_ALLREDUCE = "DDP's gradient all-reduce (in backward)"

# The live view's states, in the words it shows.
STATES = ("starting", "importing", "computing", "waiting", "loading data", "saving a checkpoint",
          "loading a checkpoint", "finished", "crashed")


def _files(stack: list[dict[str, Any]]) -> list[str]:
    return [(f.get("file") or "").replace("\\", "/") for f in stack]


def in_backward(stack: list[dict[str, Any]]) -> bool:
    """Whether the stack is inside a backward pass: a frame of one of autograd's backward entry points."""
    for frame, path in zip(stack, _files(stack)):
        if path.endswith(_AUTOGRAD_API):
            return True
        if (_AUTOGRAD_DIR in path or path.endswith(_TENSOR_FILE)) and frame.get("function") in _BACKWARD_FUNCTIONS:
            return True
    return False


def classify(stack: list[dict[str, Any]], activity: str = "") -> tuple[str, Optional[str]]:
    """(state, what it waits in) of a stalled rank: "waiting", "busy" or "computing".

    ``activity`` is the probes' note (``"in barrier #4"`` while inside a traced collective)."""
    if activity.startswith("in "):  # inside a traced torch.distributed call
        return "waiting", activity[3:]
    files = _files(stack)
    ddp_frames = [f for f, path in zip(stack, files) if path.endswith(DDP_FILE)]
    if ddp_frames:
        innermost = ddp_frames[-1]
        for needle, what in _DDP_WAITS:
            if needle == innermost.get("function") or needle in (innermost.get("code") or ""):
                return "waiting", what
    if in_backward(stack):
        return "waiting", BACKWARD
    importing = _importing(stack, files)
    if importing is not None:
        return "busy", importing
    if any("torch/distributed" in path for path in files):
        inner: dict[str, Any] = next(
            (f for f, p in zip(reversed(stack), reversed(files)) if "torch/distributed" in p), {})
        return "waiting", f"a torch.distributed call ({inner.get('function', '?')})"
    if ddp_frames:
        return "waiting", "DDP's forward"
    if not stack:
        return "waiting", activity or "an unknown place"
    if stack[-1].get("user"):
        return "computing", None
    user = [f for f in stack if f.get("user")]
    caller = f" called from {user[-1]['file'].rsplit('/', 1)[-1]}:{user[-1]['line']}" if user else ""
    return "busy", _busy_in(stack, files) + caller


def _importing(stack: list[dict[str, Any]], files: list[str]) -> Optional[str]:
    """"an import (<file>)" when the rank runs a library module's top-level code and no communication
    call encloses the import.

    A module's top-level code under torch/distributed (torch.distributed.tensor registering its ops,
    imported lazily by the script or a library) is not a collective: on a loaded machine such an
    import takes seconds, and calling it a wait would make a slow start look like a hang."""
    first = next((i for i, path in enumerate(files) if path.startswith(_IMPORTLIB)), None)
    if first is None or any("torch/distributed" in path or path.endswith(DDP_FILE) for path in files[:first]):
        return None
    modules = [(frame, path) for frame, path in zip(stack[first:], files[first:])
               if frame.get("function") == "<module>"]
    if modules and modules[-1][0].get("user"):
        return None  # the script's own module runs its top-level code: the usual rules say what it does
    user = [f for f in stack[:first] if f.get("user")]
    caller = f" called from {user[-1]['file'].rsplit('/', 1)[-1]}:{user[-1]['line']}" if user else ""
    return f"an import ({_short_path(modules[-1][1]) if modules else 'finding the module'}){caller}"


def _short_path(path: str) -> str:
    """A module's file from its package root: the part after site-packages, else its last two parts."""
    tail = path.rsplit("site-packages/", 1)[-1]
    return tail if tail != path else "/".join(path.rsplit("/", 2)[-2:])


def _busy_in(stack: list[dict[str, Any]], files: list[str]) -> str:
    """The library call a busy rank is in: a known torch component, else the innermost frame."""
    for needle, what in _KNOWN_BUSY:
        if any(needle in path for path in files):
            return what
    functions = {frame.get("function") for frame in stack}
    for function, what in _PROBE_BUSY:
        if function in functions:
            return what
    innermost = stack[-1]
    return f"{innermost.get('function')} ({innermost.get('file', '').rsplit('/', 1)[-1]})"


def live_state(stack: list[dict[str, Any]], activity: str = "", *,
               gradients_complete: bool = False) -> tuple[str, Optional[str]]:
    """(state, detail) for the live view, from a rank's stack at this instant (not a stalled one).

    ``gradients_complete``: every parameter of the DDP module(s) already got its gradient in this
    backward, so a rank still inside backward waits for DDP's gradient all-reduce, not computing.
    """
    if activity.startswith("in "):
        return "waiting", activity[3:]
    files = _files(stack)
    if not stack:
        return "starting", None
    if in_backward(stack):
        return ("waiting", DDP_GRADIENT_ALLREDUCE) if gradients_complete else ("computing", "backward")
    for path, frame in zip(reversed(files), reversed(stack)):
        if "torch/serialization.py" in path or "torch/distributed/checkpoint" in path:
            function = frame.get("function") or ""
            loading = "load" in function or any("load" in (f.get("function") or "") for f in stack
                                                 if "torch/distributed/checkpoint" in (f.get("file") or ""))
            return ("loading a checkpoint" if loading else "saving a checkpoint"), None
        if "torch/utils/data" in path:
            return "loading data", None
    state, what = classify(stack, activity)
    if state == "waiting" and what in ("DDP's forward",):
        return "computing", "forward"
    if state == "busy":
        return "computing", None
    return state, what
