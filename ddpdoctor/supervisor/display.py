"""What the user sees while the job runs: rank output, a live per-rank view, notices.

Plain, uncoloured lines when stdout is not a terminal, NO_COLOR is set or --plain is given, so CI
logs stay readable; a rich live table (rank, host, step, epoch, activity, heartbeat age) otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ddpdoctor.schema.observations import Heartbeat


class Display(Protocol):
    def output(self, rank: Optional[int], line: str) -> None: ...
    def update(self, heartbeats: dict[int, Heartbeat], now: float) -> None: ...
    def notice(self, text: str) -> None: ...
    def close(self) -> None: ...


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

    def close(self) -> None:
        pass


class PlainDisplay(NullDisplay):
    """Rank output as ``[rankN] line``; no live view."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        self.console = console
        self.show_output = show_output

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = f"[rank{rank}] " if rank is not None else ""
            self.console.print(Text(prefix + line), soft_wrap=True)

    def notice(self, text: str) -> None:
        self.console.print(Text(f"ddpdoctor: {text}"))


class LiveDisplay(PlainDisplay):
    """Rank output scrolls above a live table: rank, host, step, epoch, activity, heartbeat age."""

    def __init__(self, console: Console, *, show_output: bool = True) -> None:
        super().__init__(console, show_output=show_output)
        self._beats: dict[int, Heartbeat] = {}
        self._live = Live(self._table(time.time()), console=console, refresh_per_second=4, transient=True)
        self._live.start()

    def output(self, rank: Optional[int], line: str) -> None:
        if self.show_output:
            prefix = Text(f"[rank{rank}] ", style="dim cyan") if rank is not None else Text("")
            self._live.console.print(prefix + Text(line), soft_wrap=True)

    def update(self, heartbeats: dict[int, Heartbeat], now: float) -> None:
        self._beats = heartbeats
        self._live.update(self._table(now))

    def notice(self, text: str) -> None:
        self._live.console.print(Text(f"ddpdoctor: {text}", style="bold yellow"))

    def _table(self, now: float) -> Table:
        table = Table(title="ddpdoctor: ranks", title_justify="left", expand=False, box=None, padding=(0, 2))
        for column in ("rank", "host", "step", "epoch", "doing", "heartbeat"):
            table.add_column(column)
        for rank, beat in sorted(self._beats.items()):
            age = now - (beat.t or now)
            doing = beat.activity
            if beat.site:
                doing += f" ({os.path.basename(beat.site.get('file', ''))}:{beat.site.get('line')})"
            table.add_row(str(rank), beat.host, str(beat.steps), "" if beat.epoch is None else str(beat.epoch), doing,
                          Text(f"{age:.1f}s ago", style="red" if age > 5 else "green"))
        if not self._beats:
            table.add_row("…", "starting ranks", "", "", "", "")
        return table

    def close(self) -> None:
        self._live.stop()


def for_terminal(*, plain: bool, show_output: bool) -> tuple[Console, Display]:
    """The console and display the CLI uses."""
    plain = plain or is_plain()
    console = make_console(plain)
    display: Display = PlainDisplay(console, show_output=show_output) if plain else \
        LiveDisplay(console, show_output=show_output)
    return console, display
