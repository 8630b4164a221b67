"""One rank's ddpdoctor inside an existing launch (torchrun, a Slurm step, any launcher).

Each rank's ddpdoctor runs its rank as a child process (so a rank that crashes, or is killed,
still has its exit code and its evidence reported) and plays one of three parts:

- a node's other ranks (:class:`node.LocalPeer`): output, signals and the exit code, through
  files in the node directory; no torch, no store;
- the node's leader, local rank 0 (:class:`store.NodeRelay`): relays the node to rank 0 over the
  job's store;
- rank 0, also its node's leader: monitors the whole job (hangs, --timeout, signals) through
  :class:`store.StoreTransport`, gathers the evidence and reports.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.supervisor.display import Display
from ddpdoctor.supervisor.jobs import SubprocessJob
from ddpdoctor.supervisor.launch import ExistingLaunch, LaunchPlan
from ddpdoctor.supervisor.monitor import Monitor, MonitorResult
from ddpdoctor.supervisor.node import NodeDir, LocalPeer, shared_directory
from ddpdoctor.supervisor.job_output import OutputRouter
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import Collected

__all__ = ["Node", "RankRun", "evidence_directory", "run_rank"]


@dataclass(frozen=True)
class Node:
    """How this rank relays: the node directory, whether it leads the node, the group's name."""

    directory: str
    shared: bool  # with the node's other ranks (else a private directory, this rank a node of its own)
    group: str
    leader: bool
    num_local: int
    num_groups: int


def evidence_directory(launch: ExistingLaunch) -> Node:
    """The node this rank belongs to, and the directory its rank writes its evidence into."""
    shared = shared_directory(detected=launch.detected, run_id=launch.run_id, node_rank=launch.node_rank)
    if shared is not None:
        return Node(directory=shared, shared=True, group=f"n{launch.node_rank}", leader=launch.local_rank == 0,
                    num_local=launch.local_world_size, num_groups=launch.nnodes)
    return Node(directory=tempfile.mkdtemp(prefix="ddpdoctor-"), shared=False, group=f"r{launch.rank}", leader=True,
                num_local=1, num_groups=launch.world_size)


@dataclass
class RankRun:
    result: MonitorResult
    exit_code: int  # of this rank's own process (128+N for a signal)
    collected: Optional[Collected] = None  # rank 0: every node's evidence
    transport: Optional[object] = None  # rank 0: its StoreTransport, told once the report is built
    reported: bool = False  # a peer: rank 0's report holds this rank's evidence


class _PeerDisplay:
    """A non-zero rank's display: its rank's output; rank 0 speaks for the job (notices, live view)."""

    def __init__(self, display: Display) -> None:
        self.display = display

    def output(self, rank: Optional[int], line: str) -> None:
        self.display.output(rank, line)

    def update(self, heartbeats: dict, now: float) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Quiet:
    """The transport of a rank that judges nothing (not rank 0): no heartbeats to read."""

    def heartbeats(self) -> dict:
        return {}

    def alive(self, beat) -> bool:
        return False

    def request_stacks(self, ranks, wait_s: float = 0.0) -> dict:
        return {}

    def collect(self) -> Collected:
        return Collected()


def run_rank(plan: LaunchPlan, node: Node, *, display: Display, signals: StopSignals,
             hang_timeout_s: Optional[float], timeout_s: Optional[float]) -> RankRun:
    launch = plan.existing
    assert launch is not None
    rank = launch.rank
    notices = display
    if rank != 0:
        display = _PeerDisplay(display)  # type: ignore[assignment]
    directory = NodeDir(node.directory)
    child = SubprocessJob(plan.commands, plan.env)
    router = OutputRouter(display, nproc_per_node=1, fixed_rank=rank)
    mute = lambda: setattr(router, "muted", True)  # noqa: E731  rank 0 stops the job: what the rank prints next is noise
    relay = peer = transport = None
    child.start()  # first: the store client below imports torch, about a CPU second the rank need not wait for
    if node.leader:
        from ddpdoctor.supervisor.store import NodeRelay, StoreTransport, WorldJob, connect

        try:
            store = connect(launch)
            relay = NodeRelay(store, group=node.group, rank=rank, node=directory, child=child,
                              num_local=node.num_local, signals=signals, on_abort=mute)
            relay.register()
        except BaseException:
            child.stop()
            router.route(child.drain())
            raise
        if rank == 0:
            transport = StoreTransport(store, launch.world_size, num_groups=node.num_groups,
                                       node=directory if node.shared else None, num_local=node.num_local)
    else:
        from ddpdoctor.supervisor.store import ABORT_GRACE_S

        peer = LocalPeer(directory, rank, stop_rank=child.stop, mute=mute, signals=signals, notice=notices.notice,
                         grace_s=ABORT_GRACE_S)
    (relay or peer).start()  # type: ignore[union-attr]
    try:
        if transport is not None:
            monitor = Monitor(transport=transport, display=display, router=router, world_size=launch.world_size,
                              hang_timeout_s=hang_timeout_s, timeout_s=timeout_s, signals=signals)
            result = monitor.watch(WorldJob(child, transport))
            if result.stop is not None:
                transport.abort()
        else:  # rank 0 judges hangs for the whole job; here only output and signals are handled
            result = Monitor(transport=_Quiet(), display=display, router=router, hang_timeout_s=None,
                             timeout_s=None, detect_hangs=False, signals=signals).watch(child)
    finally:
        child.stop()
        router.route(child.drain())
    code = child.exit_codes[0] if child.exit_codes and child.exit_codes[0] is not None else 1
    code = code if code >= 0 else 128 - code
    tail = router.tail_lists().get(rank, [])
    if relay is not None:
        relay.finish(exit_code=code, tail=tail)
    else:
        peer.finish(exit_code=code, tail=tail)  # type: ignore[union-attr]
    if transport is not None:
        return RankRun(result=result, exit_code=code, collected=transport.collect(), transport=transport)
    from ddpdoctor.supervisor.store import REPORT_WAIT_S

    reported = relay.wait_for_report() if relay is not None else peer.wait_for_report(REPORT_WAIT_S)  # type: ignore[union-attr]
    if not node.shared:
        directory.remove()
    return RankRun(result=result, exit_code=code, reported=reported)


def finish_rank_zero(run: RankRun, node: Node) -> None:
    """After rank 0 built the report: let every node go, then remove this node's directory."""
    if run.transport is not None:
        run.transport.reported()  # type: ignore[attr-defined]
    NodeDir(node.directory).remove()
