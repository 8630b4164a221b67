"""Every command-line option, declared once: its flags, type, default, help, `[tool.ddpdoctor]` key and
validation (as ruff's settings and torchtitan's job config are).

The commands' typer parameters (:func:`command_options`), the validation of `[tool.ddpdoctor]`
(:mod:`ddpdoctor.supervisor.project_config`), :class:`~ddpdoctor.supervisor.config.RunConfig`'s
defaults and checks, and the README's usage block (:mod:`ddpdoctor.supervisor.usage`) all come from
here. The report files' options come from :data:`ddpdoctor.supervisor.report_files.RENDERERS`.
tests/unit/test_options.py freezes the table, so adding or changing an option is a visible change.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, Severity
from ddpdoctor.schema.sampling import AUTO, describe
from ddpdoctor.schema.settings import DEVICE_ALIASES, DEVICE_MODES, device_mode
from ddpdoctor.supervisor.report_files import GITHUB_HELP, RENDERERS

# --hang-timeout's default when it is not given: the threshold adapts to the job (supervisor/hang.py).
ADAPTIVE_HANG_MIN_S = 30.0
ADAPTIVE_HANG_STEP_FACTOR = 10.0

Validator = Callable[[str, Any], Any]


class LaunchMode(str, enum.Enum):
    auto = "auto"
    torchrun = "torchrun"
    spawn = "spawn"


# simulate's old name, cpu, is accepted too (device_mode resolves it)
DeviceMode = enum.Enum("DeviceMode", {m: m for m in (*DEVICE_MODES, *DEVICE_ALIASES)}, type=str)


@dataclass(frozen=True)
class Option:
    """One option. ``name``: the command's parameter, the key of resolved values, and the
    :class:`RunConfig` field it sets where ``run_field`` (``hang_timeout_s`` for ``--hang-timeout``).
    ``type``: int, float, bool, str, Path, list (of check ids) or an Enum of the choices.
    ``help`` may say ``{default}``. ``in_config``: settable in `[tool.ddpdoctor]`, under the long
    flag's name. ``validate(label, value)`` returns the value normalized or raises ValueError naming
    ``label`` (the flag, or the config key)."""

    name: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str
    metavar: Optional[str] = None
    in_config: bool = True
    run_field: bool = False
    validate: Optional[Validator] = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def config_key(self) -> Optional[str]:
        return self.flag[2:] if self.in_config else None

    def help_text(self) -> str:
        default = self.default.value if isinstance(self.default, enum.Enum) else self.default
        return self.help.format(default=default, adaptive_min=ADAPTIVE_HANG_MIN_S,
                                adaptive_factor=ADAPTIVE_HANG_STEP_FACTOR)

    def check(self, value: Any, *, label: Optional[str] = None) -> Any:
        """``value`` validated and normalized (None stays None: not set)."""
        if value is None:
            return None
        if isinstance(value, Path):
            value = str(value)
        return self.validate(label or self.flag, value) if self.validate else value


def at_least(low: int) -> Validator:
    def validate(label: str, value: Any) -> Any:
        if value < low:
            raise ValueError(f"{label} must be at least {low}")
        return value
    return validate


def positive(what: str) -> Validator:
    def validate(label: str, value: Any) -> Any:
        if value <= 0:
            raise ValueError(f"{label} must be a positive {what}")
        return value
    return validate


def _fingerprint_every(label: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{label} must be 0 (automatic) or a positive number of steps")
    return value


def _launch(label: str, value: Any) -> str:
    value = getattr(value, "value", value)
    if value not in LaunchMode.__members__:
        raise ValueError(f"{label} must be one of {', '.join(LaunchMode.__members__)}")
    return value


def _device(label: str, value: Any) -> str:
    return device_mode(getattr(value, "value", value))  # "cpu" -> "simulate"


def _severity(label: str, value: Any) -> Severity:
    try:
        return Severity.parse(value)
    except ValueError:
        names = ", ".join(s.value for s in sorted(Severity, key=lambda s: -s.rank))
        raise ValueError(f"{label} must be one of {names}, not {getattr(value, 'value', value)!r}") from None


def _check_ids(label: str, value: Any) -> tuple[str, ...]:
    """--select a,b --select c, or ["a", "b"] in the file -> ("a", "b", "c")."""
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{label} must be a list of check ids")
    return tuple(part.strip() for v in value for part in v.split(",") if part.strip())


NPROC_PER_NODE = Option(
    "nproc_per_node", ("--nproc-per-node", "-n"), int, 2, run_field=True, metavar="N", validate=at_least(1),
    help="Ranks per node [default: {default}; the reference job and `env`: one per GPU of this node, else {default}].")
NNODES = Option("nnodes", ("--nnodes",), int, 1, run_field=True, metavar="N", validate=at_least(1),
                help="Simulated nodes: this many local torchrun agents.")
HANG_TIMEOUT = Option(
    "hang_timeout_s", ("--hang-timeout",), float, None, run_field=True, metavar="SECONDS",
    validate=positive("number of seconds"),
    help="Seconds without progress before a rank counts as hung (default: max({adaptive_min:g}, "
         "{adaptive_factor:g}x the slowest step)).")
TIMEOUT = Option("timeout_s", ("--timeout",), float, None, run_field=True, metavar="SECONDS",
                 validate=positive("number of seconds"),
                 help="Stop the whole job after this many seconds and report.")
MAX_STEPS = Option("max_steps", ("--max-steps",), int, None, run_field=True, metavar="N", validate=at_least(1),
                   help="Stop the script cleanly on every rank after N optimizer steps (a bounded run for CI).")
MAX_EPOCHS = Option("max_epochs", ("--max-epochs",), int, None, run_field=True, metavar="N", validate=at_least(1),
                    help="Stop the script cleanly when its training loader starts pass N+1.")
SELECT = Option("select", ("--select",), list, (), run_field=True, metavar="IDS", validate=_check_ids,
                help="Run only these check ids (comma-separated).")
IGNORE = Option("ignore", ("--ignore",), list, (), run_field=True, metavar="IDS", validate=_check_ids,
                help="Do not run these check ids (comma-separated).")
FAIL_ON = Option("fail_on", ("--fail-on",), Severity, DEFAULT_FAIL_ON, metavar="LEVEL", validate=_severity,
                 help="Lowest severity that makes the exit code 1: error, warning or info [default: {default}].")
EXIT_ZERO = Option("exit_zero", ("--exit-zero",), bool, False,
                   help="Exit 0 even with findings (2 still means ddpdoctor could not run).")
LAUNCH = Option("launch", ("--launch",), LaunchMode, "auto", run_field=True, metavar="MODE", validate=_launch,
                help="torchrun, or spawn for scripts that start their own workers; {default} (default) detects.")
FINGERPRINT_EVERY = Option(
    "fingerprint_every", ("--fingerprint-every",), int, 0, run_field=True, metavar="K", validate=_fingerprint_every,
    help="Fingerprint gradients and parameters every K-th step; {default} (default): " + describe(AUTO) + "; a "
         "divergence's cause (DDP's all-reduce snapshot) and global-batch's loss windows keep the default's pace.")
QUIET = Option("quiet", ("--quiet", "-q"), bool, False, help="Hide the script's own output.")
PLAIN = Option("plain", ("--plain",), bool, False, help="Plain lines even on a terminal.")
KEEP_EVIDENCE = Option("keep_evidence", ("--keep-evidence",), Path, None, run_field=True, metavar="DIR",
                       help="Copy the raw per-rank evidence (JSON lines) and each rank's flight recorder dump here.")
DEVICE = Option(
    "device", ("--device",), DeviceMode, "auto", run_field=True, metavar="MODE", validate=_device,
    help="Simulate a GPU per rank on the CPU (nccl->gloo, CUDA tensors, torch.cuda, generators, streams, amp). "
         "{default} (default): when the ranks see no GPU and neither launcher nor framework chose the CPU "
         "(ACCELERATE_USE_CPU, PL_TRAINER_ACCELERATOR, LT_ACCELERATOR, empty CUDA_VISIBLE_DEVICES); simulate "
         "(alias: cpu): always, even beside GPUs; native: never.")
MIN_BUSBW = Option(
    "min_busbw_gbps", ("--min-busbw",), float, None, run_field=True, metavar="GBPS",
    validate=positive("bandwidth in GB/s"),
    help="Reference job: an error (collective-bandwidth) when a collective's peak bus bandwidth stays below GBPS "
         "GB/s.")
AGAINST_ONE_RANK = Option(
    "against_one_rank", ("--against-one-rank",), int, None, run_field=True, metavar="K", validate=at_least(1),
    help="After the run, replay its first K optimizer steps in one process on the union of the ranks' batches, from "
         "the same weights, and compare losses and gradients step by step (global-batch). Torchrun launches only.")
# The report files, one option per row of report_files.RENDERERS, then GitHub's annotations.
FILE_OUTPUTS: tuple[Option, ...] = tuple(Option(r.name, (r.flag,), Path, None, metavar="PATH", help=r.help)
                                         for r in RENDERERS)
GITHUB = Option("github", ("--github",), bool, False, help=GITHUB_HELP)
OUTPUTS: tuple[Option, ...] = (*FILE_OUTPUTS, GITHUB)

# `analyze` only
WORLD_SIZE = Option("world_size", ("--world-size",), int, None, in_config=False, metavar="N", validate=at_least(1),
                    help="Ranks in the job, when the dumps cannot say (a rank that left no dump is then named as "
                         "missing).")
# `env` only: its JSON may go to stdout, its Markdown is printed, and its job is tiny
ENV_JSON = Option("env_json", ("--json",), str, None, in_config=False, metavar="PATH",
                  help="Write the report as JSON here ('-': stdout, nothing else).")
ENV_MARKDOWN = Option("env_markdown", ("--markdown",), bool, False, in_config=False,
                      help="Print a Markdown block to paste into a bug report (OS, CPU, Python, torch, CUDA/NCCL, "
                           "GPUs, the packages that matter), and nothing else.")
ENV_TIMEOUT = Option("env_timeout_s", ("--timeout",), float, 120.0, in_config=False, metavar="SECONDS",
                     validate=positive("number of seconds"),
                     help="Give up after this many seconds [default: {default:g}].")

# Each command's options, in --help order.
CHECK: tuple[Option, ...] = (
    NPROC_PER_NODE, NNODES, HANG_TIMEOUT, TIMEOUT, MAX_STEPS, MAX_EPOCHS, SELECT, IGNORE, FAIL_ON, EXIT_ZERO,
    *OUTPUTS, LAUNCH, FINGERPRINT_EVERY, QUIET, PLAIN, KEEP_EVIDENCE, DEVICE, MIN_BUSBW,
    AGAINST_ONE_RANK)
REPORT: tuple[Option, ...] = (FAIL_ON, *(o for o in OUTPUTS if o.name != "json"), PLAIN)
ANALYZE: tuple[Option, ...] = (WORLD_SIZE, FAIL_ON, EXIT_ZERO, *OUTPUTS, PLAIN)
ENV: tuple[Option, ...] = (NPROC_PER_NODE, NNODES, ENV_JSON, ENV_MARKDOWN, ENV_TIMEOUT, PLAIN)
COMMANDS: dict[str, tuple[Option, ...]] = {"check": CHECK, "analyze": ANALYZE, "report": REPORT, "env": ENV}

# What `[tool.ddpdoctor]` may set: check's options, under their long flag's name.
CONFIG: dict[str, Option] = {o.config_key: o for o in CHECK if o.config_key}
# The options that set a RunConfig field of the same name.
RUN_FIELDS: tuple[Option, ...] = tuple(o for o in CHECK if o.run_field)


def negation(option: Option) -> Optional[str]:
    """The hidden ``--no-X`` that undoes a `true` from `[tool.ddpdoctor]` (its parameter is ``no_<name>``)."""
    return f"--no-{option.flag[2:]}" if option.type is bool and option.in_config else None


def _annotation(option: Option) -> Any:
    return Optional[list[str]] if option.type is list else Optional[option.type]


def parameters(options: Iterable[Option]) -> list[inspect.Parameter]:
    """The typer parameters of ``options``. Every default is None (not given), so that a command can
    tell the command line from `[tool.ddpdoctor]` and the declared default (:func:`resolve`)."""
    import typer

    params = []
    for option in options:
        info = typer.Option(None, *option.flags, metavar=option.metavar, help=option.help_text(), show_default=False)
        params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                        annotation=_annotation(option)))
        undo = negation(option)
        if undo:  # hidden, so --help lists each flag once
            params.append(inspect.Parameter(f"no_{option.name}", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                            default=typer.Option(False, undo, hidden=True)))
    return params


def command_options(options: tuple[Option, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command also takes ``options``, which typer passes into its ``**values``."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fn.__signature__ = signature.replace(parameters=[*own, *parameters(options)])  # type: ignore[attr-defined]
        fn.__ddpdoctor_options__ = options  # type: ignore[attr-defined]
        return fn
    return wrap


def resolve(options: Iterable[Option], given: Mapping[str, Any], file: Mapping[str, Any]) -> dict[str, Any]:
    """Each option's value, validated: the command line (``given``, by name) wins over `[tool.ddpdoctor]`
    (``file``, by config key, already validated), which wins over the declared default."""
    values: dict[str, Any] = {}
    for option in options:
        value = given.get(option.name)
        if given.get(f"no_{option.name}"):
            value = False
        if value is None and option.config_key in file:
            value = file[option.config_key]
        values[option.name] = option.default if value is None else option.check(value)
    return values


def files(values: Mapping[str, Any]) -> dict[str, Optional[str]]:
    """The report files ``values`` ask for: renderer name -> path (absent: not asked for this command)."""
    return {o.name: values[o.name] for o in FILE_OUTPUTS if o.name in values}
