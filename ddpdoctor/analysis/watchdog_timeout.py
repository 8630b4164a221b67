"""Whether a post-mortem's hung job was ended by the backend's watchdog: the ranks whose pending
collective had waited its whole timeout when they dumped. Pure: a stop snapshot in, ranks out."""

from __future__ import annotations

from ddpdoctor.schema.observations import StopSnapshot

__all__ = ["timed_out_ranks", "WATCHDOG_DUMP_DELAY_S"]

# How long after a collective's timeout its watchdog may take to dump: NCCL's heartbeat monitor waits
# up to 8 minutes (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=480) for a stuck watchdog before it dumps itself.
WATCHDOG_DUMP_DELAY_S = 600.0


def timed_out_ranks(stop: StopSnapshot) -> list[int]:
    """Of a post-mortem's snapshot, the ranks whose pending collective had waited its whole timeout
    (``threshold_s``: the longest timeout the dumps record) when they dumped, and not much longer:
    the watchdog fires at that moment and dumps, so these dumps are its, and the job did hang.

    A dump carries no time of its own: its file's modification time stands for it. A copy that did
    not keep that time (a checkout, ``cp`` without ``-p``) is written later, which would make any
    pending collective look timed out; a wait far past the timeout, later than any watchdog dumps,
    is therefore not taken as one."""
    timeout = stop.threshold_s
    if not timeout:
        return []
    return sorted(r for r, s in stop.ranks.items() if s.state == "waiting"
                  and timeout <= (s.stalled_s or 0.0) <= timeout + WATCHDOG_DUMP_DELAY_S)
