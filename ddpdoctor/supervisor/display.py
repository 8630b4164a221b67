"""What the user sees while the job runs: rank output, a live per-rank view, notices.

Plain, uncoloured lines when stdout is not a terminal, NO_COLOR is set or --plain is given, so CI
logs stay readable; a rich live table otherwise (rank, host, step, epoch, what the rank does and
since when, where in the user's code, its last collective), with the words of
:mod:`ddpdoctor.supervisor.live_view`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ddpdoctor.schema.observations import Heartbeat
from ddpdoctor.supervisor import live_view


class Display(Protocol):
    def output(self, rank: Optional[int], line: str) -> None: ...
    def update(self, heartbeats: dict[int, Heartbeat], now: float) -> None: ...
    def notice(self, text: str) -> None: ...
    def close(self) -> None: ...

    # Optional (callers check with getattr): progress(stall_s, threshold_s) from the monitor,
    # launcher(line) with torchrun's own log lines, exited(pid, exitcode) as torchrun saw it.


def is_plain() -> bool:
    return not sys.stdout.isatty() or bool(os.environ.get("NO_COLOR"))


def make_console(plain: bool) -> Console:
    if plain:  # CI logs: wide enough for the per-rank tables (COLUMNS overrides)
        width = int(os.environ.get("COLUMNS") or 0) or 140
        return Console(no_color=True, highlight=False, emoji=False, soft_wrap=True, force_terminal=False, width=width)
    return Console(highlight=False, emoji=False)


class NullDisplay:
    """Shows nothing (the Python API's default)."""

    def output(self, rank: Optional[int], line: str) -> None:
        pass

    def update(self, heartbeats: dict[int, Heartbeat], now: float) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def progress(self, stall_s: float, threshold_s: float) -> None:
        pass

    def launcher(self, line: str) -> None:
        pass

    def exited(self, pid: int, exitcode: int) -> None:
        pass

    def close(self) -> None:
        pass


class PlainDisplay(NullDisplay):
    """Rank output as ``[rankN] line``; no live view. torchrun's own log lines are kept, not shown
    (the report says where they went; the CLI shows them when the job could not start)."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        self.console = console
        self.show_output = show_output
        self.launcher_lines: list[str] = []

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = f"[rank{rank}] " if rank is not None else ""
            self.console.print(Text(prefix + line), soft_wrap=True)

    def launcher(self, line: str) -> None:
        self.launcher_lines.append(line)

    def notice(self, text: str) -> None:
        self.console.print(Text(f"ddpdoctor: {text}"))


class LiveDisplay(PlainDisplay):
    """Rank output scrolls above a live table: what every rank does now, its step, epoch, where in
    the user's code and its last collective, under a line with the start-up phase or the job's
    progress against the hang threshold."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        super().__init__(console, show_output=show_output)
        self._beats: dict[int, Heartbeat] = {}
        self._started = time.time()
        self._stall: Optional[tuple[float, float, float]] = None  # (stall_s, threshold_s, at)
        self._exit_codes: dict[int, int] = {}  # pid -> exit code, from torchrun's failure lines
        self._live = Live(get_renderable=self._view, console=console, refresh_per_second=4, transient=True)
        self._live.start()

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = Text(f"[rank{rank}] ", style="dim cyan") if rank is not None else Text("")
            self._live.console.print(prefix + Text(line), soft_wrap=True)

    def update(self, heartbeats: dict[int, Heartbeat], now: float) -> None:
        self._beats = dict(heartbeats)

    def progress(self, stall_s: float, threshold_s: float) -> None:
        self._stall = (stall_s, threshold_s, time.time())

    def exited(self, pid: int, exitcode: int) -> None:
        self._exit_codes[pid] = exitcode

    def notice(self, text: str) -> None:
        self._live.console.print(Text(f"ddpdoctor: {text}", style="bold yellow"))

    def _view(self) -> Group:
        now = time.time()
        stall_s = threshold_s = None
        if self._stall is not None:  # the monitor's figure, advanced to this instant while no rank moves
            stall_s, threshold_s, at = self._stall
            stall_s = stall_s + (now - at) if stall_s >= 1.0 else stall_s
        head = Text(live_view.header(self._beats, now - self._started, stall_s=stall_s, threshold_s=threshold_s),
                    style="bold")
        if not self._beats:
            return Group(head)
        table = Table(box=None, padding=(0, 2), show_edge=False, header_style="bold")
        for column in ("rank", "host", "step", "epoch", "doing", "where", "last collective"):
            table.add_column(column, no_wrap=column != "doing", overflow="ellipsis")
        for rank, beat in sorted(self._beats.items()):
            row = live_view.rank_row(beat, now, exitcode=self._exit_codes.get(beat.pid))
            table.add_row(str(row.rank), row.host, row.step, row.epoch,
                          Text(row.doing, style="red" if row.alarm else ""), row.where, row.last_collective)
        return Group(head, table)

    def close(self) -> None:
        self._live.stop()


def for_terminal(*, plain: bool, show_output: bool) -> tuple[Console, Display]:
    """The console and display the CLI uses."""
    plain = plain or is_plain()
    console = make_console(plain)
    display: Display = PlainDisplay(console, show_output=show_output) if plain else \
        LiveDisplay(console, show_output=show_output)
    return console, display
