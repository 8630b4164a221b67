"""Command line (supervisor side): ``ddpdoctor check``, ``list-checks``, ``explain``.

Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # older typer depends on click itself
    from click import exceptions as click_exceptions

from ddpdoctor._version import __version__
from ddpdoctor.supervisor import options

EXAMPLES = """\
Examples:

\b
  ddpdoctor check                                   # the built-in reference job on 2 ranks
  ddpdoctor check train.py -- --epochs 1 --lr 0.1   # your script; its own arguments after --
  ddpdoctor check train.py -n 4 --hang-timeout 10 --json report.json --html report.html
  torchrun --nproc-per-node 4 -m ddpdoctor check train.py   # inside an existing launch
  ddpdoctor check train.py --max-steps 20 --junit junit.xml --sarif ddpdoctor.sarif --github
  ddpdoctor report report.json --html report.html --trace trace.json   # render a saved report
  ddpdoctor explain gradient-sync
  ddpdoctor env -n 2 --markdown                     # versions, GPUs and variables for a bug report
"""

app = typer.Typer(
    name="ddpdoctor",
    help="Proves a PyTorch DistributedDataParallel training job is correct by running it on several "
         "ranks and watching every one of them.",
    epilog=EXAMPLES,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    # click caps help at 80 columns unless told otherwise; this lets it follow the terminal (and COLUMNS).
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 10_000},
)

class UsageProblem(Exception):
    """Bad input found after parsing (missing script, syntax error...): exit 2, one line."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Proves a DDP job correct: gradients and buffers in sync, disjoint data shards, set_epoch,
    unused parameters, hangs, crashes and checkpoints."""


@app.command(epilog=EXAMPLES)
@options.command_options(options.CHECK)
def check(
    ctx: typer.Context,
    script: Optional[Path] = typer.Argument(None, metavar="SCRIPT",
                                            help="Training script to check (default: the built-in reference job)."),
    **given: Any,
) -> int:
    """Run SCRIPT (or the reference job) on several ranks and check it. Script arguments go after --.

    Defaults come from [tool.ddpdoctor] in the nearest pyproject.toml; the command line wins
    (--no-quiet, --no-plain, --no-github and --no-exit-zero undo a true there)."""
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor import project_config
    from ddpdoctor.supervisor.config import RunConfig
    from ddpdoctor.supervisor.pipeline import NoEvidence, run

    try:
        _, file_settings = project_config.load(os.getcwd())
        values = options.resolve(options.CHECK, given, file_settings)
        if script is None and given["nproc_per_node"] is None and "nproc-per-node" not in file_settings:
            values["nproc_per_node"] = _reference_nproc(values["nnodes"])
        config = RunConfig.from_options(values, script=None if script is None else str(script),
                                        script_args=tuple((ctx.obj or {}).get("script_args", ())))
        config.script_path()
        if config.select or config.ignore:  # only they can name an unknown check (loading the checks costs every rank)
            config.checks()
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    plain = values["plain"] or displays.is_plain()
    console, display = displays.for_terminal(plain=plain, show_output=config.show_output)
    guard = contextlib.nullcontext()
    if values["github"]:  # the report's renderers are imported by the rank that reports, not by every rank
        from ddpdoctor.supervisor import report_files

        guard = report_files.github_command_guard(enabled=True)  # the script cannot inject annotations
    with guard:
        try:
            report = run(config, display=display)
        except NoEvidence as exc:
            display.close()
            _show_launcher_log(display)  # torchrun's own words on why nothing started
            raise UsageProblem(str(exc)) from None
        finally:
            display.close()
    if report.role == "peer":  # a non-zero rank of an existing launch: rank 0 reports
        return report.exit_code()
    _write_report(report, values, console=console, plain=plain)
    # 128+signal even with --exit-zero: the run did not finish; 2: ddpdoctor could not check it
    unfinished = report.outcome == "interrupted" or bool(report.unchecked)
    return 0 if values["exit_zero"] and not unfinished else report.exit_code(values["fail_on"])


def _write_report(report, values: dict[str, Any], *, console, plain: bool) -> None:
    """The report in every form the command's resolved option ``values`` ask for."""
    from ddpdoctor.supervisor import report_files

    report_files.write_all(report, console=console, plain=plain, fail_on=values["fail_on"],
                           files=options.files(values), github=values["github"])


def _show_launcher_log(display) -> None:
    for line in getattr(display, "launcher_lines", []):
        sys.stderr.write(line + "\n")


def _reference_nproc(nnodes: int) -> int:
    """The reference job and `env` run one rank per GPU of this node (simulated nodes share them),
    else 2 CPU ranks."""
    from ddpdoctor.supervisor.gpus import local_gpu_count

    gpus = local_gpu_count()
    return max(1, gpus // max(nnodes, 1)) if gpus else 2


@app.command()
@options.command_options(options.ENV)
def env(**given: Any) -> int:
    """Show every rank's environment (Python, torch, CUDA, cuDNN, NCCL, driver, GPUs, NCCL_* and launcher
    variables), from a tiny job run the way `check` runs one, and check that the ranks agree."""
    from rich.console import Console

    from ddpdoctor.analysis.render.env_command import render_environment
    from ddpdoctor.analysis.report import write_json
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor.config import RunConfig, env_job_script
    from ddpdoctor.supervisor.pipeline import NoEvidence, run

    try:
        values = options.resolve(options.ENV, given, {})
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    json_path, markdown = values["env_json"], values["env_markdown"]
    to_stdout = json_path == "-"
    if to_stdout and markdown:
        raise UsageProblem("--json - and --markdown both want stdout: choose one")
    nnodes = values["nnodes"]
    try:
        config = RunConfig(script=env_job_script(),
                           nproc_per_node=given["nproc_per_node"] or _reference_nproc(nnodes), nnodes=nnodes,
                           timeout_s=values["env_timeout_s"], select=_environment_checks(),
                           show_output=not (to_stdout or markdown))
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    plain = values["plain"] or displays.is_plain()
    console = displays.make_console(plain)
    if to_stdout or markdown:  # stdout carries the JSON or the Markdown alone
        console = Console(file=sys.stderr, no_color=plain, highlight=False)
    display = displays.PlainDisplay(console, show_output=config.show_output)
    try:
        report = run(config, display=display)
    except NoEvidence as exc:
        if markdown:  # what this machine says is still worth pasting
            from ddpdoctor.analysis.render.env_command import environment_markdown
            from ddpdoctor.supervisor.system import local_system

            sys.stdout.write(environment_markdown(None, local_system(), problem=str(exc)))
            return 2
        raise UsageProblem(str(exc)) from None
    if report.role == "peer":
        return report.exit_code()
    if markdown:
        from ddpdoctor.analysis.render.env_command import environment_markdown
        from ddpdoctor.supervisor.system import local_system

        if json_path:
            write_json(report, json_path)
        sys.stdout.write(environment_markdown(report, local_system()))
        return report.exit_code()
    if to_stdout:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    else:
        if json_path:
            write_json(report, json_path)
        render_environment(console, report, plain=plain)
    return report.exit_code()


@app.command()
@options.command_options(options.REPORT)
def report(
    path: Path = typer.Argument(..., help="A JSON report written by `ddpdoctor check --json`."),
    **given: Any,
) -> int:
    """Render a saved JSON report in the terminal, and in any other format; exit as `check` would."""
    from ddpdoctor.analysis.report import Report
    from ddpdoctor.supervisor import display as displays

    try:
        values = options.resolve(options.REPORT, given, {})
        loaded = Report.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageProblem(f"cannot read the report {path}: {exc}") from None
    plain = values["plain"] or displays.is_plain()
    console = displays.make_console(plain)
    _write_report(loaded, values, console=console, plain=plain)
    return loaded.exit_code(values["fail_on"])


@app.command()
@options.command_options(options.ANALYZE)
def analyze(
    paths: list[str] = typer.Argument(..., metavar="PATH", help="Flight recorder dumps (a folder, a glob or files; "
                                      "pickle or JSON), torchrun error files and rank logs."),
    **given: Any,
) -> int:
    """Diagnose a job that already hung or failed, from PyTorch's flight recorder dumps (and torchrun's
    error files and logs): the same checks and report as `check`, without rerunning it."""
    from rich.text import Text

    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor.analyze import analyze as analyze_files

    try:
        values = options.resolve(options.ANALYZE, given, {})
        result = analyze_files(paths, world_size=values["world_size"])
    except (OSError, ValueError) as exc:
        raise UsageProblem(str(exc)) from None
    plain = values["plain"] or displays.is_plain()
    console = displays.make_console(plain)
    info = result.report.post_mortem or {}
    read = [f"{info.get('dumps', 0)} flight recorder dump(s)" + (f" ({', '.join(info['formats'])})"
                                                                 if info.get("formats") else "")]
    read += [f"{info[k]} {what}" for k, what in (("error_files", "torchrun error file(s)"), ("logs", "log(s)"))
             if info.get(k)]
    console.print(Text(f"ddpdoctor analyze: read {', '.join(read)}"))
    for note in info.get("notes", []):
        console.print(Text(f"note: {note}", style="yellow"))
    for ignored in info.get("ignored", []):
        console.print(Text(f"skipped {ignored['path']}: {ignored['why']}", style="dim"))
    _write_report(result.report, values, console=console, plain=plain)
    return 0 if values["exit_zero"] else result.report.exit_code(values["fail_on"])


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
    except (getattr(click_exceptions, "Exit", typer.Exit), typer.Exit) as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # before run() took over the signals (it turns them into a report)
        sys.stderr.write("ddpdoctor: interrupted\n")
        sys.exit(130)
    except Exception:  # ddpdoctor itself broke: exit 2, never 0 or 1, with the traceback to report
        traceback.print_exc()
        _fail("internal error (the traceback above); the job's processes were stopped")
    sys.exit(code if isinstance(code, int) else 0)


def _looks_like_script_option(args: list[str]) -> bool:
    return any(not a.startswith("-") for a in args[1:])


def _environment_checks() -> tuple[str, ...]:
    """The checks that judge the env command's environment job, as each declares (Check.sources)."""
    from ddpdoctor.analysis.api import ENVIRONMENT
    from ddpdoctor.analysis.registry import checks_for

    return tuple(c.id for c in checks_for(ENVIRONMENT))
