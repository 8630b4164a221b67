"""Command line (supervisor side): ``ddpdoctor check``, ``list-checks``, ``explain``.

Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import enum
import sys
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


@app.command(epilog=EXAMPLES)
def check(
    ctx: typer.Context,
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
    from ddpdoctor.analysis.render import terminal
    from ddpdoctor.analysis.report import write_json
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor.config import RunConfig
    from ddpdoctor.supervisor.pipeline import NoEvidence, run

    try:
        config = RunConfig(
            script=None if script is None else str(script), script_args=tuple((ctx.obj or {}).get("script_args", ())),
            nproc_per_node=nproc_per_node, nnodes=nnodes, hang_timeout_s=hang_timeout, timeout_s=timeout,
            launch=launch.value, fingerprint_every=fingerprint_every, show_output=not quiet,
            keep_evidence=None if keep_evidence is None else str(keep_evidence))
        config.script_path()
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    plain = plain or displays.is_plain()
    console, display = displays.for_terminal(plain=plain, show_output=config.show_output)
    try:
        report = run(config, display=display)
    except NoEvidence as exc:
        raise UsageProblem(str(exc)) from None
    finally:
        display.close()
    if report.role == "peer":  # a non-zero rank of an existing launch: rank 0 reports
        return report.exit_code()
    terminal.render(console, report, plain=plain, fail_on=fail_on.value)
    if json_path is not None:
        write_json(report, str(json_path))
    return report.exit_code(fail_on.value)


@app.command("list-checks")
def list_checks() -> int:
    """List the available checks (built-in and plugins)."""
    from ddpdoctor.analysis.registry import load_checks

    for loaded in load_checks():
        title = loaded.check.title if loaded.check else f"(failed to load: {loaded.error})"
        typer.echo(f"{loaded.id:<20} {title}")
    return 0


@app.command()
def explain(check_id: str = typer.Argument(..., metavar="ID", help="A check id, e.g. gradient-sync.")) -> int:
    """Print what a check does, why it matters, a bad example and the fix."""
    from ddpdoctor.analysis.registry import find_check, load_checks

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
    args = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, script_args = args[:cut], args[cut + 1:]
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="ddpdoctor", standalone_mode=False, obj={"script_args": script_args})
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
