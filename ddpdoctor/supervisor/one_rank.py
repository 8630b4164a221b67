"""--against-one-rank: after the N-rank run, replay its first K optimizer steps in one process.

The N ranks recorded what the replay needs into a folder (ddpdoctor/rank/probes/one_rank.py, role
"record"); this starts the same script once more, under torchrun with one rank and ``--max-steps K``,
in role "replay", watched like any run (hang and timeout included), and reads back what it measured.
The script's output in the replay is kept off the screen; its last lines explain a replay that failed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Optional

from ddpdoctor.schema import settings
from ddpdoctor.schema.observations import OneRankReplay
from ddpdoctor.supervisor import launch
from ddpdoctor.supervisor.config import RunConfig
from ddpdoctor.supervisor.display import Display, NullDisplay
from ddpdoctor.supervisor.job_output import OutputRouter
from ddpdoctor.supervisor.jobs import SubprocessJob
from ddpdoctor.supervisor.monitor import Monitor
from ddpdoctor.supervisor.signals import StopSignals
from ddpdoctor.supervisor.transport import FileTransport, read_json

__all__ = ["recording", "unsupported", "replay"]

TAIL_LINES = 5


def unsupported(config: RunConfig, mode: str) -> Optional[str]:
    """Why this run cannot be replayed in one process, or None."""
    if not config.against_one_rank:
        return None
    if mode != "torchrun":
        return f"--against-one-rank replays torchrun launches only (this one: {mode})"
    return None


def recording(config: RunConfig, directory: str) -> RunConfig:
    """``config`` with its ranks recording for the replay into ``directory``."""
    return dataclasses.replace(config, one_rank_role="record", one_rank_dir=directory)


def replay(config: RunConfig, script: str, directory: str, *, display: Display, signals: StopSignals,
           world_size: int) -> OneRankReplay:
    """Replay the recorded first steps in one process and return what it measured."""
    steps = config.against_one_rank or 0
    if not any(name.startswith("rank") for name in os.listdir(directory)):
        return OneRankReplay(world_size=world_size, steps_requested=steps,
                             error="the ranks recorded nothing for the replay (the run ended before the script "
                                   "imported torch, or was stopped)")
    display.notice(f"replaying the first {steps} optimizer step{'s' if steps != 1 else ''} in one process "
                   "(--against-one-rank)")
    one = dataclasses.replace(config, nproc_per_node=1, nnodes=1, max_steps=steps, max_epochs=None,
                              keep_evidence=None, one_rank_role="replay", one_rank_dir=directory)
    evidence_dir = tempfile.mkdtemp(prefix="ddpdoctor-replay-")
    try:
        plan = launch.build_plan(one, script, evidence_dir)
        job = SubprocessJob(plan.commands, plan.env, env_per_command=plan.env_per_command)
        router = OutputRouter(NullDisplay(), nproc_per_node=1)
        monitor = Monitor(transport=FileTransport(evidence_dir), display=NullDisplay(), router=router,
                          hang_timeout_s=config.hang_timeout_s, timeout_s=config.timeout_s, world_size=1,
                          signals=signals)
        job.start()
        try:
            result = monitor.watch(job)
        finally:
            job.stop()
            router.route(job.drain())
        data = read_json(os.path.join(directory, settings.ONE_RANK_RESULT))
        if data is None:
            tail = [line for lines in router.tail_lists().values() for line in lines][-TAIL_LINES:]
            why = f"it stopped ({result.stop.reason})" if result.stop is not None else \
                f"it exited with {next((c for c in job.exit_codes if c), 'no result')}"
            return OneRankReplay(world_size=world_size, steps_requested=steps,
                                 error=f"the one-process replay measured nothing: {why}"
                                       + (f"; its last output: {' | '.join(tail)}" if tail else ""))
        data.setdefault("world_size", world_size)
        return OneRankReplay.from_json(data)
    finally:
        shutil.rmtree(evidence_dir, ignore_errors=True)
