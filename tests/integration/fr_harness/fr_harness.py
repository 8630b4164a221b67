"""Flight recorder dumps from gloo ranks the way NCCL writes them in production, outside the script.

torch 2.13 dumps on a collective timeout only for NCCL (TORCH_NCCL_DUMP_ON_TIMEOUT, from its
watchdog, every rank told through the store); gloo has no such watchdog. This harness stands in for
it, so the fixtures run unchanged under plain torchrun:

- a watchdog thread polls the recorder's active entries; a collective pending longer than
  FR_HARNESS_TIMEOUT seconds is a timeout: the rank dumps, asks every rank to dump (a marker file
  beside the dumps, as NCCL uses the store), waits for their dumps, and exits with status 1 as
  NCCL's watchdog ends a timed-out rank;
- every rank dumps once when asked, and when the script dies of an uncaught exception, for which
  it also writes torchrun's error file as ``@record`` does.

Dumps are the pickle ``_dump_fr_trace`` returns (``FR_HARNESS_FORMAT=json``: the JSON twin),
written to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``: NCCL's file naming. A killed rank leaves none, as in
production. Each entry's ``timeout_ms`` is this watchdog's timeout (FR_HARNESS_TIMEOUT), the one it
applied, as NCCL's dumps record the timeout its watchdog applies (gloo records its process group's,
30 minutes, which no test waits for). ``FR_HARNESS_DUMP_AT_EXIT=1``: every rank also dumps when its
script ends, as a job that dumps its recorder on the way out does.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import signal
import pickle
import sys
import threading
import time
import traceback

_PREFIX = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
_TIMEOUT_S = float(os.environ.get("FR_HARNESS_TIMEOUT", "10"))
_RANK = os.environ.get("RANK", "0")
_WORLD = int(os.environ.get("WORLD_SIZE", "1"))
_MARKER = os.path.join(os.path.dirname(_PREFIX) or ".", ".fr-harness-dump-all")  # hidden: not a dump
_dumped = threading.Event()
_lock = threading.Lock()


def _c10d():
    """torch's c10d bindings once the script's process group exists (torch imports it, never us)."""
    module = sys.modules.get("torch.distributed")
    try:
        if module is None or not module.is_available() or not module.is_initialized():
            return None
    except AttributeError:  # torch.distributed is still being imported
        return None
    return sys.modules["torch"]._C._distributed_c10d


def dump() -> None:
    """Write this rank's dump once (atomically: a reader never sees half a file)."""
    c10d = _c10d() or _c10d_any()
    if c10d is None:
        return
    with _lock:
        if _dumped.is_set():
            return
        if os.environ.get("FR_HARNESS_FORMAT") == "json":  # the JSON twin: no Python stacks
            data = _with_timeout(c10d._dump_fr_trace_json(True, False), json.loads, json.dumps)
        else:
            data = _with_timeout(c10d._dump_fr_trace(True, True, False), pickle.loads, pickle.dumps)
        tmp = f"{_PREFIX}{_RANK}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, f"{_PREFIX}{_RANK}")
        _dumped.set()


def _with_timeout(data, loads, dumps):
    """The dump with this watchdog's timeout as every entry's ``timeout_ms``."""
    state = loads(data)
    for entry in state.get("entries") or []:
        entry["timeout_ms"] = int(_TIMEOUT_S * 1000)
    out = dumps(state)
    return out.encode() if isinstance(out, str) else out


def _c10d_any():
    torch = sys.modules.get("torch")
    return getattr(getattr(torch, "_C", None), "_distributed_c10d", None)


def _timed_out(c10d) -> bool:
    state = pickle.loads(c10d._dump_fr_trace(True, False, True))  # active entries only, no stacks
    now = time.time_ns()
    return any(not e.get("retired") and now - e["time_created_ns"] > _TIMEOUT_S * 1e9 for e in state["entries"])


def _watch(wakeup: int) -> None:
    while not _dumped.is_set():
        if select.select([wakeup], [], [], 0.1)[0] and signal.SIGTERM in os.read(wakeup, 64):
            dump()  # torchrun stops the survivors with SIGTERM: dump, then die of it as before
            libc = ctypes.CDLL(None)
            libc.signal(signal.SIGTERM, 0)  # SIG_DFL, from this thread (signal.signal: main thread only)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if os.path.exists(_MARKER):
            dump()
            continue
        c10d = _c10d()
        if c10d is None or not _timed_out(c10d):
            continue
        dump()
        with open(_MARKER, "w") as f:
            f.write(_RANK)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(os.path.exists(f"{_PREFIX}{r}") for r in range(_WORLD)):
            time.sleep(0.1)
        sys.stderr.write(f"[fr_harness] rank {_RANK}: a collective timed out after {_TIMEOUT_S:g}s; dumped\n")
        sys.stderr.flush()
        os._exit(1)
    _wait_for_sigterm(wakeup)


def _wait_for_sigterm(wakeup: int) -> None:
    """Dumped already: still die of torchrun's SIGTERM, not of this harness's handler."""
    while signal.SIGTERM not in os.read(wakeup, 64):
        pass
    ctypes.CDLL(None).signal(signal.SIGTERM, 0)
    os.kill(os.getpid(), signal.SIGTERM)


def _write_error_file(exc: BaseException) -> None:
    """What torchrun's ``@record`` writes (ErrorHandler.record_exception), for a script without it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                                      "timestamp": str(int(time.time()))}}}
    with open(path, "w") as f:
        json.dump(data, f)


def _excepthook(previous):
    def hook(exc_type, exc, tb):
        try:
            dump()
            _write_error_file(exc)
        except Exception as failure:  # the harness never hides the script's own error
            sys.stderr.write(f"[fr_harness] could not dump: {failure}\n")
        previous(exc_type, exc, tb)

    return hook


def start() -> None:
    """Install the hooks (from the main thread, at interpreter start-up) and the watchdog thread.
    SIGTERM gets a Python handler only so that its wakeup byte reaches the watchdog even while the
    main thread is blocked in a collective, where no Python handler could run."""
    sys.excepthook = _excepthook(sys.excepthook)
    if os.environ.get("FR_HARNESS_DUMP_AT_EXIT") == "1":
        atexit.register(dump)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    threading.Thread(target=_watch, args=(read_end,), name="fr-harness", daemon=True).start()
