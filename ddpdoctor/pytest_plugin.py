"""pytest plugin (entry point ``pytest11``): the ``ddpdoctor`` fixture checks DDP code from a test.

```python
def test_training_is_correct(ddpdoctor):
    ddpdoctor.check("train.py", "--epochs", "1", timeout_s=120).assert_clean()

def test_one_step(ddpdoctor):                # a module-level function, run on every rank
    ddpdoctor.run(train_one_step, 0.1).assert_clean()
```

Each call launches the job on ``nproc_per_node`` ranks (2 gloo ranks on CPU by default) and returns
the :class:`~ddpdoctor.analysis.report.Report`. The ranks' output goes to the test's captured
stdout as ``[rankN] line``, so pytest shows it when the test fails. Only a test that asks for the
fixture pays for it: this module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import pytest

if TYPE_CHECKING:
    from ddpdoctor.analysis.report import Report
    from ddpdoctor.schema.observations import Heartbeat

__all__ = ["DDPDoctor", "ddpdoctor"]

_CALLABLE_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank", "callable_runner.py")


class _PrintDisplay:
    """Rank output through print(): pytest captures it per test and shows it when the test fails."""

    def __init__(self, show_output: bool) -> None:
        self.show_output = show_output

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            print(line if rank is None else f"[rank{rank}] {line}")

    def update(self, heartbeats: dict[int, "Heartbeat"], now: float) -> None:
        pass

    def notice(self, text: str) -> None:
        print(f"ddpdoctor: {text}")

    def close(self) -> None:
        pass


class DDPDoctor:
    """What the ``ddpdoctor`` fixture returns. ``options`` are :class:`~ddpdoctor.RunConfig` fields
    (``hang_timeout_s``, ``timeout_s``, ``fingerprint_every``, ``nnodes``, ...)."""

    def check(self, script: Union[str, os.PathLike], *script_args: str, nproc_per_node: int = 2,
              **options: Any) -> "Report":
        """Run ``script`` with ``script_args`` under ddpdoctor, as ``ddpdoctor check`` would."""
        return _run(os.fspath(script), tuple(map(str, script_args)), nproc_per_node, options)

    def run(self, fn: Callable[..., Any], *args: Any, nproc_per_node: int = 2, **options: Any) -> "Report":
        """Call ``fn(*args)`` on every rank inside an initialized gloo process group.

        ``fn`` and ``args`` travel to the ranks by pickle, so ``fn`` must be a module-level function
        of an importable module (a test module is fine); a lambda or closure is refused here, before
        anything launches.
        """
        if getattr(fn, "__module__", None) == "__main__":
            raise TypeError(f"ddpdoctor.run needs {fn!r} defined in an importable module, not in __main__")
        try:
            call = pickle.dumps((fn, args))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"ddpdoctor.run needs a picklable module-level function and arguments (no lambda or "
                            f"closure) to send to the ranks: {exc}") from exc
        fd, payload = tempfile.mkstemp(prefix="ddpdoctor-call-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump((list(sys.path), call), f)
            return _run(_CALLABLE_RUNNER, (payload,), nproc_per_node, options)
        finally:
            os.unlink(payload)


def _run(script: str, script_args: tuple[str, ...], nproc_per_node: int, options: dict[str, Any]) -> "Report":
    from ddpdoctor.schema.observations import Outcome
    from ddpdoctor.supervisor.config import RunConfig
    from ddpdoctor.supervisor.pipeline import run

    allowed = {f.name for f in dataclasses.fields(RunConfig)} - {"script", "script_args", "nproc_per_node"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unknown ddpdoctor option(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    config = RunConfig(script=script, script_args=script_args, nproc_per_node=nproc_per_node, **options)
    report = run(config, display=_PrintDisplay(config.show_output))
    if report.outcome == Outcome.INTERRUPTED and (report.interruption or {}).get("signal") == "SIGINT":
        raise KeyboardInterrupt  # the ranks are stopped; now Ctrl-C stops the test session, as it would have
    return report


@pytest.fixture
def ddpdoctor() -> DDPDoctor:
    """Runs a script or a function under ddpdoctor on several ranks and returns the report."""
    return DDPDoctor()
