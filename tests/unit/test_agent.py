"""The agent's log tails (rank/agent.py): torchrun's lines, unchanged, from polls that back off
while a rank is quiet and end as soon as torchrun stops them."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing import tail_log

from ddpdoctor.rank import agent


class _RecordingEvent(threading.Event):
    """An Event that records each wait's timeout, and is set after ``waits`` of them."""

    def __init__(self, waits: int) -> None:
        super().__init__()
        self.timeouts: list[float] = []
        self._waits = waits

    def wait(self, timeout=None) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) >= self._waits:
            self.set()
        return self.is_set()


def test_the_lines_are_torchruns_with_their_headers_in_order(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("one\ntwo\n")
    out = io.StringIO()
    finished = threading.Event()
    thread = threading.Thread(target=agent.tail_logfile,
                              args=("[rank0]:", str(log), out, finished, 0.1, lambda line: "skip" not in line))
    thread.start()
    time.sleep(0.1)
    with log.open("a") as fh:
        fh.write("three\nskip me\nfour\n")
    finished.set()  # the rank is done: everything it wrote before is still copied
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert out.getvalue() == "[rank0]:one\n[rank0]:two\n[rank0]:three\n[rank0]:four\n"


def test_a_quiet_rank_is_polled_less_and_less_and_a_line_brings_the_fast_poll_back(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("")
    finished = _RecordingEvent(waits=8)
    agent.tail_logfile("[r]:", str(log), io.StringIO(), finished, 0.1, lambda _: True)
    assert finished.timeouts == [0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.25, 0.25]

    class LineAfterThree(_RecordingEvent):
        def wait(self, timeout=None) -> bool:
            if len(self.timeouts) == 3:
                with log.open("a") as fh:
                    fh.write("hello\n")
            return super().wait(timeout)

    out = io.StringIO()
    finished = LineAfterThree(waits=6)
    agent.tail_logfile("[r]:", str(log), out, finished, 0.1, lambda _: True)
    assert finished.timeouts == [0.02, 0.04, 0.08, 0.16, 0.02, 0.04]
    assert out.getvalue() == "[r]:hello\n"


def _ended(target, *args, within_s: float = 10.0) -> bool:
    """Run ``target`` in a thread; whether it returned within ``within_s``: a liveness bound (the
    polls are an hour long), not a speed bound."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    thread.join(timeout=within_s)
    return not thread.is_alive()


def test_a_stop_ends_a_quiet_tail_at_once_and_one_whose_file_never_came(tmp_path: Path, monkeypatch) -> None:
    for poll in ("TAIL_FAST_S", "TAIL_IDLE_S"):  # every poll an hour: a tail that waited one out would never end here
        monkeypatch.setattr(agent, poll, 3600.0)
    log = tmp_path / "stdout.log"
    log.write_text("x\n")
    for path in (log, tmp_path / "never.log"):
        finished = threading.Event()
        thread = threading.Thread(target=agent.tail_logfile, args=("[r]:", str(path), io.StringIO(), finished, 0.1),
                                  daemon=True)
        thread.start()
        time.sleep(0.5)  # into its first poll
        finished.set()
        thread.join(timeout=10)
        assert not thread.is_alive()  # torchrun's own waits out a poll


def test_torchruns_tails_use_it_and_stop_without_waiting_out_polls(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tail_log, "tail_logfile", tail_log.tail_logfile)  # undone after the test
    for poll in ("TAIL_FAST_S", "TAIL_IDLE_S"):  # every poll an hour: a stop that waited one out would never end
        monkeypatch.setattr(agent, poll, 3600.0)
    agent.quicker_tails()
    assert tail_log.tail_logfile is agent.tail_logfile
    files = {rank: str(tmp_path / f"{rank}.log") for rank in range(4)}
    for path in files.values():
        Path(path).write_text("started\n")
    out = io.StringIO()
    tails = tail_log.TailLog("trainer", files, out).start()
    time.sleep(1.0)
    assert _ended(tails.stop)
    assert sorted(out.getvalue().splitlines()) == [f"[trainer{rank}]:started" for rank in range(4)]


def test_a_torch_whose_tails_take_other_arguments_keeps_its_own(monkeypatch) -> None:
    def other(header, file, dst, finished, interval_sec, log_line_filter=None, encoding="utf-8"):
        return None

    monkeypatch.setattr(tail_log, "tail_logfile", other)
    agent.quicker_tails()
    assert tail_log.tail_logfile is other
