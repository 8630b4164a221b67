"""Command line: ``ddpdoctor check``, ``list-checks``, ``explain``.

Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import enum
import os
import shutil
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # older typer depends on click itself
    from click import exceptions as click_exceptions

from ddpdoctor import __version__

EXAMPLES = """\
Examples:

  ddpdoctor check                                   # the built-in reference job on 2 ranks

  ddpdoctor check train.py -- --epochs 1 --lr 0.1   # your script; its own arguments after --

  ddpdoctor check train.py --nproc-per-node 4 --hang-timeout 10 --json report.json

  torchrun --nproc-per-node 4 -m ddpdoctor check train.py   # inside an existing launch

  ddpdoctor explain gradient-sync
"""

app = typer.Typer(
    name="ddpdoctor",
    help="Proves a PyTorch DistributedDataParallel training job is correct by running it on several "
         "ranks and watching every one of them.",
    epilog=EXAMPLES,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_script_args: list[str] = []


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    info = "info"


class LaunchMode(str, enum.Enum):
    auto = "auto"
    torchrun = "torchrun"
    spawn = "spawn"


class UsageProblem(Exception):
    """Bad input found after parsing (missing script, syntax error...): exit 2, one line."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Proves a DDP job correct: gradients and buffers in sync, disjoint data shards, set_epoch,
    unused parameters, hangs, crashes and checkpoints."""


def reference_script() -> str:
    spec = find_spec("ddpdoctor.fixtures")
    if spec is None or not spec.submodule_search_locations:
        raise UsageProblem("the bundled reference job is missing from this installation")
    return os.path.join(list(spec.submodule_search_locations)[0], "reference.py")


def _validate_script(script: Path) -> str:
    if not script.exists():
        raise UsageProblem(f"script not found: {script}")
    if script.is_dir():
        raise UsageProblem(f"{script} is a directory; give the training script (a .py file)")
    try:
        source = script.read_bytes()
        compile(source, str(script), "exec")
    except SyntaxError as exc:
        raise UsageProblem(f"{script}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise UsageProblem(f"cannot read {script}: {exc}") from None
    return str(script.resolve())


@app.command(epilog=EXAMPLES)
def check(
    script: Optional[Path] = typer.Argument(None, help="Training script to check (default: the built-in reference job)."),
    nproc_per_node: int = typer.Option(2, "--nproc-per-node", "-n", help="Ranks per node."),
    nnodes: int = typer.Option(1, "--nnodes", help="Simulated nodes: this many local torchrun agents."),
    hang_timeout: Optional[float] = typer.Option(
        None, "--hang-timeout", help="Seconds without progress before a rank counts as hung "
                                     "(default: max(30, 10x the slowest step))."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop the whole job after this many seconds and report."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the machine-readable report here."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", help="Lowest severity that makes the exit code 1."),
    launch: LaunchMode = typer.Option(LaunchMode.auto, "--launch",
                                      help="torchrun, or spawn for scripts that start their own workers; auto detects."),
    fingerprint_every: int = typer.Option(
        0, "--fingerprint-every", help="Fingerprint gradients and parameters every K-th step; 0 (default): steps "
                                       "1-20, then every 10th to step 200, then every 50th."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Hide the script's own output."),
    plain: bool = typer.Option(False, "--plain", help="Plain lines even on a terminal."),
    keep_evidence: Optional[Path] = typer.Option(None, "--keep-evidence", help="Copy the raw per-rank evidence here."),
) -> int:
    """Run SCRIPT (or the reference job) on several ranks and check it. Script arguments go after --."""
    from ddpdoctor.launch import RunConfig

    if nproc_per_node < 1:
        raise UsageProblem("--nproc-per-node must be at least 1")
    if nnodes < 1:
        raise UsageProblem("--nnodes must be at least 1")
    for name, value in (("--hang-timeout", hang_timeout), ("--timeout", timeout)):
        if value is not None and value <= 0:
            raise UsageProblem(f"{name} must be a positive number of seconds")
    if fingerprint_every < 0:
        raise UsageProblem("--fingerprint-every must be 0 (automatic) or a positive number of steps")
    is_reference = script is None
    script_path = reference_script() if is_reference else _validate_script(script)
    config = RunConfig(
        script=script_path, script_args=tuple(_script_args), is_reference=is_reference,
        nproc_per_node=nproc_per_node, nnodes=nnodes, hang_timeout_s=hang_timeout, timeout_s=timeout,
        launch=launch.value, fingerprint_every=fingerprint_every, show_output=not quiet,
    )
    from ddpdoctor import inlaunch
    if inlaunch.inside_existing_launch():
        return inlaunch.run(config, json_path=json_path, fail_on=fail_on.value, plain=plain)
    return _run_supervised(config, json_path=json_path, fail_on=fail_on.value, plain=plain, keep_evidence=keep_evidence)


def _run_supervised(config, *, json_path: Optional[Path], fail_on: str, plain: bool, keep_evidence: Optional[Path]) -> int:
    from ddpdoctor import ui
    from ddpdoctor.analysis import all_findings, run_checks
    from ddpdoctor.launch import build_plan
    from ddpdoctor.report import build_report, exit_code, write_json
    from ddpdoctor.supervisor import Supervisor

    plain = plain or ui.is_plain()
    console = ui.make_console(plain)
    evidence_dir = tempfile.mkdtemp(prefix="ddpdoctor-")
    try:
        plan = build_plan(config, evidence_dir)
        display = ui.PlainDisplay(console, show_output=config.show_output) if plain else \
            ui.LiveDisplay(console, show_output=config.show_output)
        try:
            result = Supervisor(config, plan, evidence_dir, display).run()
        finally:
            display.close()
        if keep_evidence is not None:
            shutil.copytree(evidence_dir, keep_evidence, dirs_exist_ok=True)
        evidence = result.evidence
        if not evidence.ranks and not evidence.unranked:
            raise UsageProblem("the job produced no evidence: torchrun or the bootstrap failed to start (see output above)")
        outcomes = run_checks(evidence)
        report = build_report(version=__version__, script=None if config.is_reference else config.script,
                              argv=list(config.script_args), evidence=evidence, outcomes=outcomes,
                              duration_s=result.duration_s, mode=result.mode)
        ui.render_report(console, report, plain=plain)
        if json_path is not None:
            write_json(report, str(json_path))
        return exit_code(all_findings(outcomes), fail_on)
    finally:
        shutil.rmtree(evidence_dir, ignore_errors=True)


@app.command("list-checks")
def list_checks() -> int:
    """List the available checks (built-in and plugins)."""
    from ddpdoctor.registry import load_checks

    for loaded in load_checks():
        title = loaded.check.title if loaded.check else f"(failed to load: {loaded.error})"
        typer.echo(f"{loaded.id:<20} {title}")
    return 0


@app.command()
def explain(check_id: str = typer.Argument(..., metavar="ID", help="A check id, e.g. gradient-sync.")) -> int:
    """Print what a check does, why it matters, a bad example and the fix."""
    from ddpdoctor.registry import find_check, load_checks

    loaded = find_check(check_id)
    if loaded is None or loaded.check is None:
        known = ", ".join(c.id for c in load_checks())
        raise UsageProblem(f"unknown check id {check_id!r}; known: {known}")
    typer.echo(f"# {loaded.id}: {loaded.check.title}\n")
    typer.echo(loaded.check.docs.rstrip())
    return 0


def _fail(message: str) -> None:
    sys.stderr.write(f"ddpdoctor: error: {message}\n")
    sys.exit(2)


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point. Arguments after ``--`` belong to the user's script."""
    global _script_args
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        cut = args.index("--")
        args, _script_args = args[:cut], args[cut + 1:]
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="ddpdoctor", standalone_mode=False)
    except click_exceptions.NoSuchOption as exc:
        hint = " (arguments for your script go after --)" if _looks_like_script_option(args) else ""
        _fail(exc.format_message() + hint)
    except click_exceptions.UsageError as exc:
        _fail(exc.format_message())
    except typer.Abort:
        _fail("aborted")
    except UsageProblem as exc:
        _fail(str(exc))
    except (click_exceptions.Exit, typer.Exit) as exc:
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


def _looks_like_script_option(args: list[str]) -> bool:
    return any(not a.startswith("-") for a in args[1:])
