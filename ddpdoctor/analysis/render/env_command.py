"""``ddpdoctor env`` in a terminal: one row per rank (versions, host, GPU), then the variables,
each shown once when every rank has the same value and per rank where they differ."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis.render.words import format_bytes, verdict
from ddpdoctor.analysis.report import Report

__all__ = ["ranks_table", "devices_table", "variables_table", "render_environment"]


def _gpu(env: Mapping[str, Any]) -> str:
    device = env.get("device")
    if device:
        memory = next((g.get("memory_bytes") for g in env.get("gpus", []) if g.get("index") == device.get("index")),
                      None)
        name = device.get("name") or "GPU"
        return f"cuda:{device['index']} {name}" + (f" {format_bytes(memory)}" if memory else "")
    if env.get("gpus"):
        return f"{len(env['gpus'])} visible, none used"
    return "-"


def _table(title: str) -> Table:
    return Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", title=title, title_justify="left")


def ranks_table(environment: Sequence[Mapping[str, Any]]) -> Table:
    """Where each rank runs and with what software; its devices are :func:`devices_table` (two
    tables, so each fits an 80-column terminal without cutting a value)."""
    table = _table("ranks")
    for column in ("rank", "host", "node", "local", "python", "torch", "backend"):
        table.add_column(column, no_wrap=True)
    for env in environment:
        table.add_row(*[str(v) if v not in (None, "") else "-" for v in (
            env["rank"], env.get("host"), env.get("node"), env.get("local_rank"), env.get("python"), env.get("torch"),
            env.get("backend"))])
    return table


def devices_table(environment: Sequence[Mapping[str, Any]]) -> Table:
    table = _table("devices")
    for column in ("rank", "CUDA", "cuDNN", "NCCL", "driver"):
        table.add_column(column, no_wrap=True)
    table.add_column("GPU", overflow="fold")
    for env in environment:
        table.add_row(*[str(v) if v not in (None, "") else "-" for v in (
            env["rank"], env.get("cuda"), env.get("cudnn"), env.get("nccl"), env.get("driver"))], _gpu(env))
    return table


def variables_table(environment: Sequence[Mapping[str, Any]]) -> Optional[Table]:
    names = sorted({k for env in environment for k in env.get("variables", {})})
    if not names:
        return None
    table = _table("variables")
    table.add_column("variable", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name in names:
        values = {env["rank"]: env.get("variables", {}).get(name) for env in environment}
        if len(set(values.values())) == 1:
            table.add_row(name, str(next(iter(values.values()))))
            continue
        groups: dict[str, list[int]] = {}
        for rank, value in values.items():
            groups.setdefault("(unset)" if value is None else value, []).append(rank)
        table.add_row(name, "; ".join(f"{value} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
                                      for value, ranks in groups.items()))
    return table


def render_environment(console: Console, report: Report, *, plain: bool) -> None:
    """The environment tables, then the findings of the checks that judge it (and any crash), then a verdict."""
    from ddpdoctor.analysis.render import terminal

    nodes = len({(e.get("host"), e.get("node")) for e in report.environment})
    console.print()
    console.print(Text(f"ddpdoctor {report.version} env: {len(report.environment)} of {report.world_size} ranks "
                       f"on {nodes} node{'s' if nodes != 1 else ''}, outcome {report.outcome}", style="bold"))
    console.print(ranks_table(report.environment))
    console.print(devices_table(report.environment))
    variables = variables_table(report.environment)
    if variables is not None:
        console.print(variables)
    for check in report.checks:
        console.print(Text(f"[{check.status.upper()}] {check.id}: {check.summary}" if plain else
                           f"{check.id}: {check.summary}"))
    for finding in report.findings:
        terminal.render_finding(console, finding, plain=plain)
    console.print(Text(verdict(report), style="bold"))


def environment_markdown(report: Optional[Report], system: Mapping[str, Any], *, problem: Optional[str] = None) -> str:
    """A block to paste into a bug report, as ``accelerate env`` prints one: this machine (OS, CPU,
    Python, packages) and what every rank saw (torch, CUDA, cuDNN, NCCL, driver, backend, GPU)."""
    lines = ["<details open><summary>ddpdoctor env</summary>", "", "- OS: " + str(system.get("os")),
             f"- CPU: {system.get('cpu')} ({system.get('cpus')} logical CPUs"
             + (f", {system['memory_gib']} GiB memory)" if system.get("memory_gib") else ")"),
             f"- Python: {system.get('python')}"]
    packages = system.get("packages") or {}
    if packages:
        lines.append("- Packages: " + ", ".join(f"{name} {version}" for name, version in packages.items()))
    if report is not None and report.environment:
        first = report.environment[0]
        lines += [f"- torch {first.get('torch') or '-'}, CUDA {first.get('cuda') or 'none'}, cuDNN "
                  f"{first.get('cudnn') or 'none'}, NCCL {first.get('nccl') or 'none'}, driver "
                  f"{first.get('driver') or 'none'}, backend {first.get('backend') or '-'}",
                  f"- Ranks: {len(report.environment)} of {report.world_size}, outcome {report.outcome}", "",
                  "| rank | host | node | local | torch | CUDA | NCCL | backend | GPU |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for env in report.environment:
            cells = [env.get("rank"), env.get("host"), env.get("node"), env.get("local_rank"), env.get("torch"),
                     env.get("cuda"), env.get("nccl"), env.get("backend")]
            lines.append("| " + " | ".join("-" if c in (None, "") else str(c).replace("|", "\\|") for c in cells)
                         + f" | {_gpu(env)} |")
        variables = sorted({k for env in report.environment for k in env.get("variables", {})
                            if k.startswith(("NCCL_", "CUDA_", "TORCH_", "OMP_", "GLOO_"))})
        if variables:
            lines += ["", "Variables: " + ", ".join(
                f"`{name}={sorted({str(e.get('variables', {}).get(name)) for e in report.environment})[0]}`"
                if len({str(e.get("variables", {}).get(name)) for e in report.environment}) == 1
                else f"`{name}` (differs across ranks)" for name in variables)]
        verdicts = [f"{c.id}: {c.summary}" for c in report.checks if c.status != "skip"]
        if verdicts:
            lines += [""] + [f"- {verdict}" for verdict in verdicts]
    if problem:
        lines += ["", f"- The ranks could not report their own environment: {problem}"]
    lines += ["", "</details>", ""]
    return "\n".join(lines)
