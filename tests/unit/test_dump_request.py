"""The dump request over files: each rank's answer is matched to this request's token, and nobody
waits for a rank that will never answer."""

from __future__ import annotations

import json
import threading
import time

from ddpdoctor.schema import layout
from ddpdoctor.schema.dump_request import read_answer, request_dumps


def _answer(directory: str, pid: int, *, after_s: float = 0.0) -> threading.Thread:
    """A rank's watchdog: once the request is there, write ``stack-<pid>.json`` with its token."""

    def run() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with open(layout.dump_request_path(directory)) as f:
                    requested = f.read().strip()
            except OSError:
                requested = ""
            if requested:
                time.sleep(after_s)
                with open(layout.stack_path(directory, pid), "w") as f:
                    json.dump({"token": requested, "stack": [], "pid": pid}, f)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_every_answer_is_collected_by_pid(tmp_path):
    threads = [_answer(str(tmp_path), 11), _answer(str(tmp_path), 12, after_s=0.1)]
    answers = request_dumps(str(tmp_path), [11, 12], wait_s=3.0)
    assert sorted(answers) == [11, 12] and answers[12]["pid"] == 12
    for thread in threads:
        thread.join()


def test_a_stale_answer_is_not_this_requests(tmp_path):
    (tmp_path / "stack-11.json").write_text(json.dumps({"token": "an-older-request"}))
    polls: list[int] = []
    assert request_dumps(str(tmp_path), [11], wait_s=0.3, still_waiting=lambda pid: polls.append(pid) is None) == {}
    assert len(polls) >= 2  # it kept waiting for this request's answer
    assert read_answer(str(tmp_path), 11, "an-older-request") == {"token": "an-older-request"}


def test_a_process_that_exited_is_not_waited_for(tmp_path):
    polls: list[int] = []
    assert request_dumps(str(tmp_path), [11], wait_s=5.0, still_waiting=lambda pid: polls.append(pid) is not None) == {}
    assert polls == [11]  # asked once, then given up on
