"""Command line (supervisor side): ``ddpdoctor check``, ``list-checks``, ``explain``.

Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
import traceback
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

SEVERITIES = ("error", "warning", "info")


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    info = "info"


class LaunchMode(str, enum.Enum):
    auto = "auto"
    torchrun = "torchrun"
    spawn = "spawn"


class DeviceMode(str, enum.Enum):
    auto = "auto"
    simulate = "simulate"
    cpu = "cpu"  # the old name of "simulate", kept as an alias (RunConfig resolves it)
    native = "native"


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


def _merged(cli: dict, file: dict, defaults: dict) -> dict:
    """CLI values given on the command line win over [tool.ddpdoctor], which wins over defaults."""
    return {key: cli[key] if cli.get(key) is not None else file.get(key, defaults.get(key)) for key in defaults}


DEFAULTS = {
    "nproc-per-node": 2, "nnodes": 1, "hang-timeout": None, "timeout": None, "fail-on": "warning",
    "exit-zero": False, "launch": "auto", "fingerprint-every": 0, "max-steps": None, "max-epochs": None,
    "select": [], "ignore": [], "json": None, "junit": None, "sarif": None, "markdown": None, "github": False,
    "quiet": False, "plain": False, "device": "auto", "min-busbw": None, "html": None, "trace": None,
}


def _ids(values: Optional[list[str]]) -> Optional[list[str]]:
    """--select a,b --select c -> [a, b, c]."""
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@app.command(epilog=EXAMPLES)
def check(
    ctx: typer.Context,
    script: Optional[Path] = typer.Argument(None, metavar="SCRIPT",
                                            help="Training script to check (default: the built-in reference job)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", "-n", metavar="N",
                                                 help="Ranks per node [default: 2]."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", metavar="N",
                                         help="Simulated nodes: this many local torchrun agents."),
    hang_timeout: Optional[float] = typer.Option(
        None, "--hang-timeout", metavar="SECONDS", help="Seconds without progress before a rank counts as hung "
                                                        "(default: max(30, 10x the slowest step))."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help="Stop the whole job after this many seconds and report."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", metavar="N",
                                            help="Stop the script cleanly on every rank after N optimizer steps "
                                                 "(a bounded run for CI)."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", metavar="N",
                                             help="Stop the script cleanly when its training loader starts pass N+1."),
    select: Optional[list[str]] = typer.Option(None, "--select", metavar="IDS",
                                               help="Run only these check ids (comma-separated)."),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", metavar="IDS",
                                               help="Do not run these check ids (comma-separated)."),
    fail_on: Optional[FailOn] = typer.Option(None, "--fail-on", metavar="LEVEL",
                                             help="Lowest severity that makes the exit code 1: error, warning or info "
                                                  "[default: warning]."),
    exit_zero: Optional[bool] = typer.Option(None, "--exit-zero",
                                             help="Exit 0 even with findings (2 still means ddpdoctor could not run)."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Write the machine-readable report here."),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="PATH",
                                         help="Write JUnit XML here (one testcase per check)."),
    sarif: Optional[Path] = typer.Option(None, "--sarif", metavar="PATH", help="Write SARIF 2.1.0 here (code scanning)."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", metavar="PATH", help="Write a Markdown summary here."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="PATH",
                                        help="Write the report as one self-contained HTML page (timeline, step times, "
                                             "code; opens offline)."),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="PATH",
                                         help="Write a Chrome trace (Perfetto, chrome://tracing): one track per rank."),
    github: Optional[bool] = typer.Option(None, "--github",
                                          help="GitHub Actions: annotations, and a summary in $GITHUB_STEP_SUMMARY."),
    launch: Optional[LaunchMode] = typer.Option(None, "--launch", metavar="MODE",
                                                help="torchrun, or spawn for scripts that start their own workers; "
                                                     "auto (default) detects."),
    fingerprint_every: Optional[int] = typer.Option(
        None, "--fingerprint-every", metavar="K", help="Fingerprint gradients and parameters every K-th step; 0 "
                                                       "(default): steps 1-20, then every 10th to step 200, then "
                                                       "every 50th."),
    quiet: Optional[bool] = typer.Option(None, "--quiet", "-q", help="Hide the script's own output."),
    plain: Optional[bool] = typer.Option(None, "--plain", help="Plain lines even on a terminal."),
    keep_evidence: Optional[Path] = typer.Option(None, "--keep-evidence", metavar="DIR",
                                                 help="Copy the raw per-rank evidence here."),
    device: Optional[DeviceMode] = typer.Option(
        None, "--device", metavar="MODE", help="Simulate a GPU per rank on the CPU (nccl->gloo, CUDA tensors, "
                               "torch.cuda, generators, streams, amp). auto (default): when the ranks see no GPU and "
                               "neither launcher nor framework chose the CPU (ACCELERATE_USE_CPU, PL_TRAINER_ACCELERATOR, "
                               "LT_ACCELERATOR, empty CUDA_VISIBLE_DEVICES); simulate (alias: cpu): always, even "
                               "beside GPUs; native: never."),
    min_busbw: Optional[float] = typer.Option(
        None, "--min-busbw", metavar="GBPS", help="Reference job: an error (collective-bandwidth) when a collective's "
                                                  "peak bus bandwidth stays below GBPS GB/s."),
    # Undo a `true` from [tool.ddpdoctor]; hidden, so --help lists each flag once.
    no_exit_zero: bool = typer.Option(False, "--no-exit-zero", hidden=True),
    no_github: bool = typer.Option(False, "--no-github", hidden=True),
    no_quiet: bool = typer.Option(False, "--no-quiet", hidden=True),
    no_plain: bool = typer.Option(False, "--no-plain", hidden=True),
) -> int:
    """Run SCRIPT (or the reference job) on several ranks and check it. Script arguments go after --.

    Defaults come from [tool.ddpdoctor] in the nearest pyproject.toml; the command line wins
    (--no-quiet, --no-plain, --no-github and --no-exit-zero undo a true there)."""
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor import project_config
    from ddpdoctor.supervisor.config import RunConfig
    from ddpdoctor.supervisor.pipeline import NoEvidence, run

    exit_zero, github, quiet, plain = (False if off else on for on, off in (
        (exit_zero, no_exit_zero), (github, no_github), (quiet, no_quiet), (plain, no_plain)))
    cli = {"nproc-per-node": nproc_per_node, "nnodes": nnodes, "hang-timeout": hang_timeout, "timeout": timeout,
           "fail-on": fail_on.value if fail_on else None, "exit-zero": exit_zero,
           "launch": launch.value if launch else None, "fingerprint-every": fingerprint_every,
           "max-steps": max_steps, "max-epochs": max_epochs, "select": _ids(select), "ignore": _ids(ignore),
           "json": json_path and str(json_path), "junit": junit and str(junit), "sarif": sarif and str(sarif),
           "markdown": markdown and str(markdown), "github": github, "quiet": quiet, "plain": plain,
           "device": device.value if device else None, "min-busbw": min_busbw,
           "html": html and str(html), "trace": trace and str(trace)}
    try:
        _, file_settings = project_config.load(os.getcwd())
        opts = _merged(cli, file_settings, DEFAULTS)
        if script is None and nproc_per_node is None and "nproc-per-node" not in file_settings:
            opts["nproc-per-node"] = _reference_nproc(opts["nnodes"])
        if opts["fail-on"] not in SEVERITIES:
            raise ValueError(f"fail-on must be one of {', '.join(SEVERITIES)}, not {opts['fail-on']!r}")
        config = RunConfig(
            script=None if script is None else str(script), script_args=tuple((ctx.obj or {}).get("script_args", ())),
            nproc_per_node=opts["nproc-per-node"], nnodes=opts["nnodes"], hang_timeout_s=opts["hang-timeout"],
            timeout_s=opts["timeout"], launch=opts["launch"], fingerprint_every=opts["fingerprint-every"],
            max_steps=opts["max-steps"], max_epochs=opts["max-epochs"], select=tuple(opts["select"]),
            ignore=tuple(opts["ignore"]), show_output=not opts["quiet"],
            keep_evidence=None if keep_evidence is None else str(keep_evidence), device=opts["device"],
            min_busbw_gbps=opts["min-busbw"])
        config.script_path()
        if config.select or config.ignore:  # only they can name an unknown check (loading the checks costs every rank)
            config.checks()
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    plain = opts["plain"] or displays.is_plain()
    console, display = displays.for_terminal(plain=plain, show_output=config.show_output)
    guard = contextlib.nullcontext()
    if opts["github"]:  # the report's renderers are imported by the rank that reports, not by every rank
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
    from ddpdoctor.supervisor import report_files

    report_files.write_all(report, console=console, plain=plain, fail_on=opts["fail-on"], json_path=opts["json"],
                      junit=opts["junit"], sarif=opts["sarif"], markdown=opts["markdown"], github=opts["github"],
                      html=opts["html"], trace=opts["trace"])
    # 128+signal even with --exit-zero: the run did not finish; 2: ddpdoctor could not check it
    unfinished = report.outcome == "interrupted" or bool(report.unchecked)
    return 0 if opts["exit-zero"] and not unfinished else report.exit_code(opts["fail-on"])


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
def env(
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", "-n", metavar="N",
                                                 help="Ranks per node [default: GPUs on this node, else 2]."),
    nnodes: int = typer.Option(1, "--nnodes", metavar="N", help="Simulated nodes: this many local torchrun agents."),
    json_path: Optional[str] = typer.Option(None, "--json", metavar="PATH", help="Write the report as JSON here "
                                                                                  "('-': stdout, nothing else)."),
    markdown: bool = typer.Option(False, "--markdown",
                                  help="Print a Markdown block to paste into a bug report (OS, CPU, Python, torch, "
                                       "CUDA/NCCL, GPUs, the packages that matter), and nothing else."),
    timeout: float = typer.Option(120, "--timeout", metavar="SECONDS", help="Give up after this many seconds."),
    plain: bool = typer.Option(False, "--plain", help="Plain lines even on a terminal."),
) -> int:
    """Show every rank's environment (Python, torch, CUDA, cuDNN, NCCL, driver, GPUs, NCCL_* and launcher
    variables), from a tiny job run the way `check` runs one, and check that the ranks agree."""
    from rich.console import Console

    from ddpdoctor.analysis.render.env_command import render_environment
    from ddpdoctor.analysis.report import write_json
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor.config import RunConfig, env_job_script
    from ddpdoctor.supervisor.pipeline import NoEvidence, run

    to_stdout = json_path == "-"
    if to_stdout and markdown:
        raise UsageProblem("--json - and --markdown both want stdout: choose one")
    try:
        config = RunConfig(script=env_job_script(), nproc_per_node=nproc_per_node or _reference_nproc(nnodes),
                           nnodes=nnodes, timeout_s=timeout, select=("env-consistency", "rank-failure"),
                           show_output=not (to_stdout or markdown))
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    plain = plain or displays.is_plain()
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
def report(
    path: Path = typer.Argument(..., help="A JSON report written by `ddpdoctor check --json`."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", metavar="LEVEL",
                                   help="Lowest severity that makes the exit code 1: error, warning or info."),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="PATH", help="Write JUnit XML here."),
    sarif: Optional[Path] = typer.Option(None, "--sarif", metavar="PATH", help="Write SARIF 2.1.0 here."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", metavar="PATH", help="Write a Markdown summary here."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="PATH", help="Write the self-contained HTML page here."),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="PATH",
                                         help="Write a Chrome trace (Perfetto, chrome://tracing) here."),
    github: bool = typer.Option(False, "--github", help="Print GitHub Actions annotations."),
    plain: bool = typer.Option(False, "--plain", help="Plain lines even on a terminal."),
) -> int:
    """Render a saved JSON report in the terminal, and in any other format; exit as `check` would."""
    from ddpdoctor.analysis.report import Report
    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor import report_files

    try:
        loaded = Report.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageProblem(f"cannot read the report {path}: {exc}") from None
    plain = plain or displays.is_plain()
    console = displays.make_console(plain)
    report_files.write_all(loaded, console=console, plain=plain, fail_on=fail_on.value, json_path=None,
                      junit=junit and str(junit), sarif=sarif and str(sarif), markdown=markdown and str(markdown),
                      github=github, html=html and str(html), trace=trace and str(trace))
    return loaded.exit_code(fail_on.value)


@app.command()
def analyze(
    paths: list[str] = typer.Argument(..., metavar="PATH", help="Flight recorder dumps (a folder, a glob or files; "
                                      "pickle or JSON), torchrun error files and rank logs."),
    world_size: Optional[int] = typer.Option(None, "--world-size", metavar="N", help="Ranks in the job, when the "
                                             "dumps cannot say (a rank that left no dump is then named as missing)."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", metavar="LEVEL",
                                   help="Lowest severity that makes the exit code 1: error, warning or info."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Write the machine-readable report here."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="PATH", help="Write the self-contained HTML page here."),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="PATH",
                                         help="Write a Chrome trace (Perfetto, chrome://tracing) here."),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="PATH", help="Write JUnit XML here."),
    sarif: Optional[Path] = typer.Option(None, "--sarif", metavar="PATH", help="Write SARIF 2.1.0 here."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", metavar="PATH", help="Write a Markdown summary here."),
    github: bool = typer.Option(False, "--github", help="Print GitHub Actions annotations."),
    plain: bool = typer.Option(False, "--plain", help="Plain lines even on a terminal."),
) -> int:
    """Diagnose a job that already hung or failed, from PyTorch's flight recorder dumps (and torchrun's
    error files and logs): the same checks and report as `check`, without rerunning it."""
    from rich.text import Text

    from ddpdoctor.supervisor import display as displays
    from ddpdoctor.supervisor import report_files
    from ddpdoctor.supervisor.analyze import analyze as analyze_files

    try:
        result = analyze_files(paths, world_size=world_size)
    except (OSError, ValueError) as exc:
        raise UsageProblem(str(exc)) from None
    plain = plain or displays.is_plain()
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
    report_files.write_all(result.report, console=console, plain=plain, fail_on=fail_on.value,
                      json_path=json_path and str(json_path), junit=junit and str(junit), sarif=sarif and str(sarif),
                      markdown=markdown and str(markdown), github=github, html=html and str(html),
                      trace=trace and str(trace))
    return 0 if exit_zero else result.report.exit_code(fail_on.value)


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
