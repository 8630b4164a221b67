"""Entry point of every rank process: install the probes, then run the user's script unchanged.

``python .../ddpdoctor/rank/bootstrap.py SCRIPT [ARGS...]`` is what torchrun starts in place of the
script. The script sees its own ``sys.argv`` and runs as ``__main__``; its exit status, output and
exceptions pass through, its tracebacks without ddpdoctor's frames.
"""

from __future__ import annotations

import os
import platform
import runpy
import sys

if __name__ == "__main__" and sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    sys.path.pop(0)  # run by path: this package's modules must not pose as top-level ones

import warnings  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: see rank/agent.py

from ddpdoctor.rank import bounds, callsite, probes, relaunch, teardown, tracebacks  # noqa: E402
from ddpdoctor.rank.recorder import Recorder  # noqa: E402
from ddpdoctor.rank.watchdog import Watchdog  # noqa: E402
from ddpdoctor.schema import settings as rank_settings  # noqa: E402
from ddpdoctor.schema.events import Exit, ExceptionEvent, ProcessStart, RunCut as RunCutEvent, SysExit  # noqa: E402


class Session:
    """Probes, recorder and watchdog of one rank process."""

    def __init__(self) -> None:
        config = rank_settings.RankSettings.from_env()
        self.rec = Recorder(config)
        rec = self.rec
        torch = sys.modules.get("torch")  # imported already (a spawned worker); otherwise the environment probe says
        rec.emit(ProcessStart(pid=os.getpid(), host=rec.host, local_rank=rec.local_rank, node_rank=rec.node_rank,
                              world_size=rec.world_size, fingerprint_every=rec.fingerprint_every,
                              python_version=platform.python_version(),
                              torch_version=str(torch.__version__) if torch is not None else ""))
        rec.activity = "starting"
        self.watchdog = Watchdog(rec, interval_s=config.heartbeat_s)
        self.watchdog.start()
        self.finish_probes = probes.install(rec)

    def record_exception(self, exc: BaseException) -> None:
        self.rec.host_copies.flush()  # the steps before the failure, in order before it
        headline = (str(exc).strip().splitlines() or [""])[0]
        self.rec.exit_info = {"code": 1, "exception": f"{type(exc).__name__}: {headline}"[:160].rstrip(": ")}
        frames = callsite.traceback_user_frames(exc.__traceback__, limit=12)
        user = [f for f in frames if f["user"]]
        self.rec.emit(ExceptionEvent(
            type=type(exc).__name__, message=str(exc)[:4000], frames=frames,
            location={"file": user[-1]["file"], "line": user[-1]["line"]} if user else None, epoch=self.rec.epoch))

    def close(self, *, exit_code: Optional[int]) -> None:
        self.rec.host_copies.flush()  # the last steps' fingerprints, still on their way from the device
        try:
            self.finish_probes()
        except Exception as exc:
            self.rec.probe_failed("lifecycle", exc, target="finish")
        self.rec.emit(Exit(code=exit_code))
        if self.rec.exit_info is None:
            self.rec.exit_info = {"code": exit_code}
        self.rec.set_activity("exited")
        self.watchdog.stop()
        self.rec.close()
        if self.rec.rank is not None:  # a process group existed: its worker threads must finish first
            teardown.settle_backend_threads()


def exit_code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def run_recorded(target: Callable[[], Any]) -> Any:
    """Run ``target`` under probes, recording how it ended, and re-raise whatever it raised
    (except the stop of a bounded run, which ends it cleanly)."""
    session = Session()
    try:
        result = target()
    except bounds.RunCut as cut:  # --max-steps / --max-epochs: a clean end, on purpose
        session.rec.host_copies.flush()
        session.rec.emit(RunCutEvent(reason=cut.reason, at=cut.at))
        session.rec.exit_info = {"code": 0, "cut": cut.reason}
        session.close(exit_code=0)
        return None
    except relaunch.Relaunch:  # a guessed spawn launcher that wants torchrun: the supervisor starts again
        session.rec.exit_info = {"code": 0}
        session.close(exit_code=0)
        return None
    except SystemExit as exc:
        code = exit_code_of(exc)
        if code != 0:
            session.rec.emit(SysExit(code=code, location=_raise_site(exc)))
        session.close(exit_code=code)
        raise
    except BaseException as exc:
        if relaunch.missed_torchrun(exc, spawned=probes.spawn_started()):
            _relaunch_quietly(session, exc)
            return None
        session.record_exception(exc)
        session.close(exit_code=1)
        raise
    session.close(exit_code=0)
    return result


def _relaunch_quietly(session: Session, exc: BaseException) -> None:
    """A guessed spawn launcher that reached for torchrun's variables: ask for torchrun, end cleanly."""
    site = _raise_site(exc)
    try:
        relaunch.ask(session.rec.evidence_dir, [site] if site else [])
    except relaunch.Relaunch:
        pass
    session.rec.exit_info = {"code": 0}
    session.close(exit_code=0)


def _raise_site(exc: BaseException) -> Optional[dict]:
    user = [f for f in callsite.traceback_user_frames(exc.__traceback__) if f["user"]]
    return {"file": user[-1]["file"], "line": user[-1]["line"]} if user else None


def run_script(script: str, args: list[str]) -> None:
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` would
    os.environ[rank_settings.SCRIPT] = script
    run_recorded(lambda: runpy.run_path(script, run_name="__main__"))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python bootstrap.py SCRIPT [ARGS...]")
    try:
        run_script(sys.argv[1], sys.argv[2:])
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # what Python does with an uncaught exception, minus our frames
        tracebacks.print_exception(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
