"""One torchrun agent, run by the supervisor: ``python .../ddpdoctor/agent.py OUT.json -- TORCHRUN_ARGS``.

It is torch.distributed.run itself (rendezvous, worker start, failure handling, SIGTERM to the
survivors) plus one addition: when workers fail, it writes torchrun's failure table as JSON so the
supervisor gets exit codes and signals per rank without parsing logs.
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


def main() -> None:
    out_path, sep, *torchrun_args = sys.argv[1:]
    assert sep == "--", "usage: python agent.py OUT.json -- TORCHRUN_ARGS"
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path.pop(0)  # run by path: this package's modules must not pose as top-level ones
    _die_with_parent()
    quiet_numpy_warning()
    from ddpdoctor.rank.gc_pause import gc_paused

    # torchrun's own log lines (a worker failed, a death signal received) reach the supervisor, which
    # keeps them off the screen (supervisor/job_output.py) and in the report's launcher log instead.
    with gc_paused(freeze=True):
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

    quicker_tails()
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
