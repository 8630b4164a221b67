"""One torchrun agent, run by the supervisor: ``python .../ddpdoctor/agent.py OUT.json -- TORCHRUN_ARGS``.

It is torch.distributed.run itself (rendezvous, worker start, failure handling, SIGTERM to the
survivors) plus one addition: when workers fail, it writes torchrun's failure table as JSON so the
supervisor gets exit codes and signals per rank without parsing logs.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import warnings


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


TAIL_INTERVAL_S = 0.02


def quicker_tails() -> None:
    """torchrun's --tee tails each rank's stdout and stderr files in threads that poll every 0.1 s,
    and stops them one stream after the other, each waiting out a poll: 0.1-0.2 s added to every
    run after its last rank exited. Polling every 20 ms costs those threads about 0.2% of a core."""
    from torch.distributed.elastic.multiprocessing import tail_log

    init = tail_log.TailLog.__init__

    def __init__(self, *args, interval_sec: float = TAIL_INTERVAL_S, **kwargs) -> None:
        init(self, *args, interval_sec=interval_sec, **kwargs)

    tail_log.TailLog.__init__ = __init__


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
