"""One torchrun agent, run by the supervisor: ``python .../ddpdoctor/agent.py OUT.json -- TORCHRUN_ARGS``.

It is torch.distributed.run itself (rendezvous, worker start, failure handling, SIGTERM to the
survivors) plus two additions: when workers fail, it writes torchrun's failure table as JSON so the
supervisor gets exit codes and signals per rank without parsing logs; and before it stops the
survivors of a failure, it asks them to flush their evidence (:func:`dump_survivors_before_stop`).
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import signal
import sys
import threading
import time
import warnings
from typing import Callable, Optional, TextIO


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this agent if the supervisor dies, so no agent is ever orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def quiet_numpy_warning() -> None:
    """torch warns "Failed to initialize NumPy" at import when numpy is absent; the agent and the
    ranks would print it once each. It says nothing about the job."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


TAIL_FAST_S = 0.02  # the poll while a rank writes
TAIL_IDLE_S = 0.25  # the longest poll while it is quiet


def tail_logfile(header: str, file: str, dst: TextIO, finished: threading.Event, interval_sec: float,
                 log_line_filter: Optional[Callable[[str], bool]] = None) -> None:
    """torchrun's ``tail_log.tail_logfile`` (the same lines, in the same order, to the same
    destination), with two changes. Its waits end as soon as torchrun stops the tails: torchrun
    stopped them one stream after the other, each waiting out a poll of 0.1 s, after every run.
    And it polls every 20 ms while lines come, backing off to 0.25 s while the rank is quiet:
    four tails polling every 20 ms used 1.3% of a core during training, on a core a rank needs."""
    del interval_sec  # the fixed poll this replaces
    wait = TAIL_FAST_S
    while not os.path.exists(file):
        if finished.wait(wait):
            if not os.path.exists(file):
                return
            break
        wait = min(TAIL_IDLE_S, wait * 2)
    wait = TAIL_FAST_S
    with open(file, errors="replace") as fp:
        while True:
            line = fp.readline()
            if line:
                wait = TAIL_FAST_S
                if log_line_filter and log_line_filter(line):  # as torchrun's: no filter, no line
                    dst.write(f"{header}{line}")
            elif finished.is_set():
                break  # the producer is done and its file read to the end
            else:
                finished.wait(wait)
                wait = min(TAIL_IDLE_S, wait * 2)


def quicker_tails() -> None:
    """Put :func:`tail_logfile` in place of torchrun's, which ``TailLog.start`` looks up at each
    call. A torch whose tails take other arguments keeps its own (the arguments are checked first)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    original = tail_log.tail_logfile
    if list(inspect.signature(original).parameters) != list(inspect.signature(tail_logfile).parameters):
        return
    tail_log.tail_logfile = tail_logfile


# How long the survivors of a failed rank get to flush their evidence before torchrun stops them: a
# watchdog answers at its next heartbeat (every 0.5 s), and a loaded machine may be late by as much.
SURVIVOR_DUMP_WAIT_S = 1.5


def _running(pid: int) -> bool:
    """Alive and not a zombie (a failed worker torchrun has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def dump_survivors_before_stop(evidence_dir: str, wait_s: float = SURVIVOR_DUMP_WAIT_S) -> None:
    """Make torchrun ask the surviving workers of a failure for a dump before it SIGTERMs them.

    A survivor waiting in a collective its failed peer never joined raises on its own only if its
    backend notices the peer is gone (gloo does, NCCL mostly does not) and only if that happens
    before torchrun's next poll (0.1 s), which stops the survivors as soon as one worker failed.
    Stopped first, it takes with it what it had not yet written: the collectives DDP issued from C++
    since its last event, its open data passes. The dump request makes its watchdog write them, so
    the report says where every rank was. A stop the supervisor asked for (no worker failed) has had
    its own dump already.
    """
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    from ddpdoctor.schema.dump_request import request_dumps

    original = SubprocessContext._close
    asked: set[int] = set()  # the contexts whose survivors were asked: once (a stop signal may close again)

    def _close(self, *args, **kwargs):
        try:
            if getattr(self, "_failures", None) and id(self) not in asked:
                asked.add(id(self))
                survivors = [h.proc.pid for h in self.subprocess_handlers.values() if h.proc.poll() is None]
                if survivors:
                    request_dumps(evidence_dir, survivors, wait_s, still_waiting=_running)
        except (OSError, ValueError, AttributeError):  # evidence is best effort; the stop is not (a
            pass  # stop signal's SignalException goes on to torchrun, as without this wait)
        return original(self, *args, **kwargs)

    SubprocessContext._close = _close  # type: ignore[method-assign]


def main() -> None:
    out_path, sep, *torchrun_args = sys.argv[1:]
    assert sep == "--", "usage: python agent.py OUT.json -- TORCHRUN_ARGS"
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path.pop(0)  # run by path: this package's modules must not pose as top-level ones
    _die_with_parent()
    quiet_numpy_warning()
    from ddpdoctor.rank.gc_pause import gc_paused
    from ddpdoctor.schema.settings import EVIDENCE_DIR

    # torchrun's own log lines (a worker failed, a death signal received) reach the supervisor, which
    # keeps them off the screen (supervisor/job_output.py) and in the report's launcher log instead.
    with gc_paused(freeze=True):
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

    quicker_tails()
    evidence_dir = os.environ.get(EVIDENCE_DIR)
    if evidence_dir:
        dump_survivors_before_stop(evidence_dir)
    try:
        run(parse_args(torchrun_args))
    except ChildFailedError as exc:
        failures = [
            {
                "rank": rank,
                "local_rank": f.local_rank,
                "pid": f.pid,
                "exitcode": f.exitcode,
                "signal": f.signal_name() if f.exitcode < 0 else None,
                "t": f.timestamp,
            }
            for rank, f in sorted(exc.failures.items())
        ]
        with open(out_path, "w") as fh:
            json.dump({"failures": failures, "t": time.time()}, fh)
        sys.exit(1)
    except SignalException as exc:  # the supervisor stopped the job; torchrun has stopped the workers
        sys.exit(128 + int(exc.sigval))


if __name__ == "__main__":
    main()
