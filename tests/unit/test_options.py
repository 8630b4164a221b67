"""Every option is declared once (ddpdoctor/supervisor/options.py), and the CLI, [tool.ddpdoctor],
RunConfig, the report files and the README's usage block come from that declaration.

The snapshot below freezes the table: adding, renaming or changing the default of an option must
edit it, so the change is visible in review.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib

import pytest
import typer
from builders import init_pg, make_evidence, on_all, process_start

from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.schema.findings import DEFAULT_FAIL_ON, Severity
from ddpdoctor.supervisor import options, project_config, report_files, usage
from ddpdoctor.supervisor.cli import app
from ddpdoctor.supervisor.config import RunConfig

README = pathlib.Path(__file__).parents[2] / "README.md"

# name: (flags, type, default, [tool.ddpdoctor] key)
FROZEN = {
    "nproc_per_node": (("--nproc-per-node", "-n"), "int", 2, "nproc-per-node"),
    "nnodes": (("--nnodes",), "int", 1, "nnodes"),
    "hang_timeout_s": (("--hang-timeout",), "float", None, "hang-timeout"),
    "timeout_s": (("--timeout",), "float", None, "timeout"),
    "max_steps": (("--max-steps",), "int", None, "max-steps"),
    "max_epochs": (("--max-epochs",), "int", None, "max-epochs"),
    "select": (("--select",), "list", (), "select"),
    "ignore": (("--ignore",), "list", (), "ignore"),
    "fail_on": (("--fail-on",), "Severity", "warning", "fail-on"),
    "exit_zero": (("--exit-zero",), "bool", False, "exit-zero"),
    "json": (("--json",), "Path", None, "json"),
    "html": (("--html",), "Path", None, "html"),
    "trace": (("--trace",), "Path", None, "trace"),
    "junit": (("--junit",), "Path", None, "junit"),
    "sarif": (("--sarif",), "Path", None, "sarif"),
    "markdown": (("--markdown",), "Path", None, "markdown"),
    "github": (("--github",), "bool", False, "github"),
    "launch": (("--launch",), "LaunchMode", "auto", "launch"),
    "fingerprint_every": (("--fingerprint-every",), "int", 0, "fingerprint-every"),
    "quiet": (("--quiet", "-q"), "bool", False, "quiet"),
    "plain": (("--plain",), "bool", False, "plain"),
    "keep_evidence": (("--keep-evidence",), "Path", None, "keep-evidence"),
    "device": (("--device",), "DeviceMode", "auto", "device"),
    "min_busbw_gbps": (("--min-busbw",), "float", None, "min-busbw"),
    "against_one_rank": (("--against-one-rank",), "int", None, "against-one-rank"),
    "world_size": (("--world-size",), "int", None, None),
    "env_json": (("--json",), "str", None, None),
    "env_markdown": (("--markdown",), "bool", False, None),
    "env_timeout_s": (("--timeout",), "float", 120.0, None),
}
FROZEN_COMMANDS = {
    "check": ["nproc_per_node", "nnodes", "hang_timeout_s", "timeout_s", "max_steps", "max_epochs", "select",
              "ignore", "fail_on", "exit_zero", "json", "html", "trace", "junit", "sarif", "markdown", "github",
              "launch", "fingerprint_every", "quiet", "plain", "keep_evidence", "device", "min_busbw_gbps",
              "against_one_rank"],
    "analyze": ["world_size", "fail_on", "exit_zero", "json", "html", "trace", "junit", "sarif", "markdown", "github",
                "plain"],
    "report": ["fail_on", "html", "trace", "junit", "sarif", "markdown", "github", "plain"],
    "env": ["nproc_per_node", "nnodes", "env_json", "env_markdown", "env_timeout_s", "plain"],
}


def declared() -> dict[str, options.Option]:
    every = [o for group in options.COMMANDS.values() for o in group]
    by_name = {o.name: o for o in every}
    assert len({id(o) for o in every}) == len(by_name), "two declarations share a name"
    return by_name


def test_the_option_table_is_frozen():
    def row(o: options.Option) -> tuple:
        default = o.default.value if isinstance(o.default, enum.Enum) else o.default
        return (o.flags, o.type.__name__, default, o.config_key)

    assert {name: row(o) for name, o in declared().items()} == FROZEN
    assert {cmd: [o.name for o in group] for cmd, group in options.COMMANDS.items()} == FROZEN_COMMANDS


def test_each_command_takes_exactly_its_declared_options():
    group = typer.main.get_command(app)
    for name, declared_options in options.COMMANDS.items():
        params = [p for p in group.commands[name].params if p.param_type_name == "option" and not p.hidden]
        assert [(p.name, tuple(p.opts)) for p in params] == [(o.name, o.flags) for o in declared_options], name
        hidden = sorted(p.opts[0] for p in group.commands[name].params if getattr(p, "hidden", False))
        assert hidden == sorted(filter(None, map(options.negation, declared_options))), name


def test_the_fail_on_default_is_the_one_severity_constant():
    assert options.FAIL_ON.default is DEFAULT_FAIL_ON is Severity.WARNING
    assert options.FAIL_ON.type is Severity


def test_every_check_option_with_a_key_is_settable_in_the_project_config():
    assert set(project_config.CONFIG) == {o.config_key for o in options.CHECK if o.in_config}
    assert "keep-evidence" in project_config.CONFIG


def test_run_config_fields_take_the_declared_names_and_defaults():
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for option in options.RUN_FIELDS:
        assert option.name in fields, option.name
        assert fields[option.name].default == option.default, option.name
    assert fields["show_output"].default is (not options.QUIET.default)


@pytest.mark.parametrize("option, bad, message", [
    (options.NPROC_PER_NODE, 0, "--nproc-per-node must be at least 1"),
    (options.HANG_TIMEOUT, 0, "--hang-timeout must be a positive number of seconds"),
    (options.MIN_BUSBW, -1.0, "--min-busbw must be a positive bandwidth in GB/s"),
    (options.AGAINST_ONE_RANK, 0, "--against-one-rank must be at least 1"),
    (options.LAUNCH, "mpirun", "--launch must be one of auto, torchrun, spawn"),
    (options.DEVICE, "gpu", "--device must be one of"),
    (options.FINGERPRINT_EVERY, -1, "--fingerprint-every must be 0"),
])
def test_run_config_validates_through_the_declarations(option, bad, message):
    with pytest.raises(ValueError, match=message):
        option.check(bad)
    with pytest.raises(ValueError, match=message):
        RunConfig(**{option.name: bad})


def test_the_hang_default_lives_in_the_declaration():
    from ddpdoctor.supervisor import hang

    assert hang.MIN_ADAPTIVE_S == options.ADAPTIVE_HANG_MIN_S
    assert hang.STEP_FACTOR == options.ADAPTIVE_HANG_STEP_FACTOR
    assert "max(30, 10x the slowest step)" in options.HANG_TIMEOUT.help_text()
    assert hang.HangDetector(hang_timeout_s=options.HANG_TIMEOUT.default).threshold_s() == 30.0


def test_the_report_file_options_are_the_renderers():
    assert [(o.name, o.flag) for o in options.FILE_OUTPUTS] == [(r.name, r.flag) for r in report_files.RENDERERS]
    assert [o.help for o in options.FILE_OUTPUTS] == [r.help for r in report_files.RENDERERS]


def test_write_all_writes_every_renderers_file(tmp_path, capsys):
    from rich.console import Console

    evidence = make_evidence(2, on_all(2, process_start(), init_pg(2)))
    report = build_report(evidence, analyze(evidence), version="0", script="/job/train.py", argv=[], duration_s=1.0)
    paths = {r.name: str(tmp_path / f"out.{r.name}") for r in report_files.RENDERERS}
    with open(tmp_path / "terminal", "w") as terminal:
        report_files.write_all(report, console=Console(file=terminal), plain=True, fail_on=DEFAULT_FAIL_ON,
                               files=paths, github=False)
    assert all(pathlib.Path(p).stat().st_size > 0 for p in paths.values())


def test_the_readme_usage_block_is_generated_from_the_declarations():
    # On failure: python -m ddpdoctor.supervisor.usage README.md
    assert usage.readme_block(README.read_text()) == usage.usage_markdown()
