"""The processes ddpdoctor starts: each in its own session, output pumped line by line, and every
descendant stopped at the end, so nothing is ever left behind."""

from __future__ import annotations

import queue
import subprocess
import threading
from typing import Optional

from ddpdoctor.supervisor import processes

STOP_GRACE_S = 2.0


class SubprocessJob:
    """Commands started together (torchrun agents, a spawn launcher, or one rank's child)."""

    def __init__(self, commands: list[list[str]], env: dict[str, str], *, env_per_command: Optional[list[dict]] = None,
                 cwd: Optional[str] = None) -> None:
        self.commands = commands
        self.env = env
        self.env_per_command = env_per_command or [{} for _ in commands]
        self.cwd = cwd
        self.procs: list[subprocess.Popen] = []
        self.lines: "queue.Queue[tuple[int, str]]" = queue.Queue()
        self._pumps: list[threading.Thread] = []
        self._known: dict[int, Optional[int]] = {}

    def start(self) -> None:
        for index, command in enumerate(self.commands):
            proc = subprocess.Popen(command, env={**self.env, **self.env_per_command[index]}, cwd=self.cwd,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            self.procs.append(proc)
            self._known[proc.pid] = None
            pump = threading.Thread(target=_pump, args=(proc, index, self.lines), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def finished(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def track(self) -> None:
        """Remember every descendant now (a /proc scan), so stop() reaches orphans too."""
        for proc in self.procs:
            self._known.update(processes.descendants(proc.pid))

    def stop(self) -> None:
        """Stop the commands and every process under them; nothing may survive."""
        self.track()
        processes.stop_all(dict(self._known), grace_s=STOP_GRACE_S)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pump in self._pumps:
            pump.join(timeout=2)

    def drain(self) -> list[tuple[int, str]]:
        """Output lines since the last call, as (command index, line)."""
        out = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out

    @property
    def exit_codes(self) -> list[Optional[int]]:
        return [p.returncode for p in self.procs]


def _pump(proc: subprocess.Popen, index: int, lines: "queue.Queue[tuple[int, str]]") -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        lines.put((index, raw.decode("utf-8", errors="replace").rstrip("\n")))
    proc.stdout.close()
