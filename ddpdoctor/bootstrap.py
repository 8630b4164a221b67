"""Entry point of every rank process: install the probes, then run the user's script unchanged.

``python .../ddpdoctor/bootstrap.py SCRIPT [ARGS...]`` is what torchrun starts in place of the
script. The script sees its own ``sys.argv`` and runs as ``__main__``; its exit status, output and
exceptions pass through untouched.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Callable, Optional

from ddpdoctor import callsite, envvars, probes, recorder
from ddpdoctor.recorder import Recorder
from ddpdoctor.watchdog import Watchdog


class Session:
    """Probes, recorder and watchdog of one rank process."""

    def __init__(self, watchdog_factory: Optional[Callable[[Recorder], Watchdog]] = None) -> None:
        evidence_dir = os.environ[envvars.EVIDENCE_DIR]
        every = int(os.environ.get(envvars.FINGERPRINT_EVERY, "0") or 0)
        self.rec = Recorder(evidence_dir, fingerprint_every=every)
        recorder.install(self.rec)
        self.finish_probes = probes.install(self.rec)
        interval_s = float(os.environ.get(envvars.HEARTBEAT_S, "0.5"))
        self.watchdog = (watchdog_factory or (lambda rec: Watchdog(rec, interval_s=interval_s)))(self.rec)
        self.watchdog.start()

    def record_exception(self, exc: BaseException) -> None:
        frames = callsite.traceback_user_frames(exc.__traceback__, limit=12)
        user = [f for f in frames if f["user"]]
        self.rec.emit(
            "exception",
            type=type(exc).__name__,
            message=str(exc)[:4000],
            frames=frames,
            location={"file": user[-1]["file"], "line": user[-1]["line"]} if user else None,
            epoch=self.rec.epoch,
        )

    def close(self, *, exit_code: Optional[int]) -> None:
        try:
            self.finish_probes()
        except Exception as exc:
            self.rec.emit("probe_error", probe="finish", error=repr(exc))
        self.rec.emit("exit", code=exit_code)
        self.rec.set_activity("exited")
        self.watchdog.stop()
        self.rec.close()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def run_recorded(target: Callable[[], Any], watchdog_factory: Optional[Callable[[Recorder], Watchdog]] = None) -> Any:
    """Run ``target`` under probes, recording how it ended, and re-raise whatever it raised."""
    session = Session(watchdog_factory)
    try:
        result = target()
    except SystemExit as exc:
        code = _exit_code(exc)
        if code != 0:
            session.rec.emit("sys_exit", code=code, location=_raise_site(exc))
        session.close(exit_code=code)
        raise
    except BaseException as exc:
        session.record_exception(exc)
        session.close(exit_code=1)
        raise
    session.close(exit_code=0)
    return result


def _raise_site(exc: BaseException) -> Optional[dict]:
    user = [f for f in callsite.traceback_user_frames(exc.__traceback__) if f["user"]]
    return {"file": user[-1]["file"], "line": user[-1]["line"]} if user else None


def run_probed(fn: Callable[..., Any], *args: Any) -> Any:
    """Used inside torch.multiprocessing workers: the same recording around the worker function."""
    return run_recorded(lambda: fn(*args))


def run_script(script: str, args: list[str], watchdog_factory: Optional[Callable[[Recorder], Watchdog]] = None) -> None:
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` would (replaces the bootstrap's own dir)
    os.environ[envvars.SCRIPT] = script
    run_recorded(lambda: runpy.run_path(script, run_name="__main__"), watchdog_factory)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python bootstrap.py SCRIPT [ARGS...]")
    run_script(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
