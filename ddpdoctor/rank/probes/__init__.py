"""In-rank probes. ``install`` hooks torch as soon as the script has imported it, before any of
the script's code uses it; nothing here changes what the script computes, and a probe that fails
is recorded, never raised into the script. Third-party probes (found by ddpdoctor.plugins, which
loads no check of ddpdoctor's) install after the built-in ones, under their check's id."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable, Iterator

from ddpdoctor import plugins
from ddpdoctor.rank.after_import import AfterImport
from ddpdoctor.rank.gc_pause import gc_paused
from ddpdoctor.rank.probes import patching
from ddpdoctor.rank.recorder import Recorder

# Each module's install(rec) returns an optional finalizer run when the script ends.
# "device" (CUDA/NCCL simulation on CPU) first: the probes after it wrap its stand-ins.
PROBE_MODULES = ("device", "lifecycle", "ddp", "optimizer", "collectives", "data", "join", "spawn", "checkpoint",
                 "environment", "content", "flight_recorder", "config", "wrapping", "data_parallel", "sharding",
                 "loss", "one_rank")

NOT_INSTALLED = "torch was imported without ddpdoctor's import hook firing, so no probe was installed"


def install(rec: Recorder) -> Callable[[], None]:
    """Install every probe once torch is imported (now, if it already is): a script that never
    imports torch does not pay the second it takes to import. Returns a finalizer that flushes
    state still open at exit, then removes the hooks and restores everything patched."""
    finalizers: list[tuple[str, Callable[[], None]]] = []
    installed = False

    def install_all(_torch: Any = None) -> None:
        nonlocal installed
        installed = True
        for name, target in _installers(rec):
            try:
                module, _, function = target.partition(":")
                finalizer = getattr(importlib.import_module(module), function)(rec)
            except Exception as exc:
                rec.probe_failed(name, exc, phase="install")
                continue
            if finalizer is not None:
                finalizers.append((name, finalizer))
        rec.set_activity("starting")

    def importing() -> None:
        rec.activity = "importing"  # the live view shows it, with a timer; a long import is no stall

    hook = None
    if "torch" in sys.modules:  # imported before the bootstrap ran (sitecustomize, a .pth file): probe it now
        install_all()
    else:
        hook = AfterImport("torch", install_all, on_found=importing,
                           around=functools.partial(gc_paused, freeze=True)).insert()

    def missed_import() -> None:
        """torch imported past the hook (nothing was probed): the job cannot be checked, which the
        report says instead of judging a script it did not see (``NOT_INSTALLED``)."""
        if not installed and "torch" in sys.modules:
            rec.probe_failed("lifecycle", RuntimeError(NOT_INSTALLED), target="import hook", phase="install")

    def missed_import_at_dump() -> None:
        """A dump (a hang's, or torchrun's agent's before it stops a failed job's survivors) may come
        while torch is still being imported: it is in ``sys.modules`` from the import's start, and
        the hook fires at its end. Nothing was missed then."""
        if rec.activity != "importing":
            missed_import()

    rec.on_dump.append(missed_import_at_dump)  # said before the job is stopped

    def finish() -> None:
        if hook is not None:
            hook.remove()
        missed_import()
        for name, finalizer in reversed(finalizers):
            try:
                finalizer()
            except Exception as exc:
                rec.probe_failed(name, exc, target="finish")
        patching.restore_all()

    return finish


def _installers(rec: Recorder) -> Iterator[tuple[str, str]]:
    """(probe name, "module:function"): the built-ins, then (looked up only once those are in) the plugins'."""
    for name in PROBE_MODULES:
        yield name, f"ddpdoctor.rank.probes.{name}:install"
    yield from _plugin_probes(rec)


def _plugin_probes(rec: Recorder) -> list[tuple[str, str]]:
    """(check id, "module:function") of every third-party probe (none under DDPDOCTOR_DISABLE_PLUGINS=1);
    unreadable package metadata is recorded as a failed probe, broken plugins are the supervisor's to report."""
    try:
        return plugins.plugin_probes()
    except Exception as exc:  # the built-in probes still run
        rec.probe_failed("plugins", exc, phase="install")
        return []


def spawn_started() -> bool:
    """Whether this process started workers (mp.spawn) or is one: then it is no launcher to relaunch."""
    from ddpdoctor.rank.probes import spawn

    return spawn.spawned()
