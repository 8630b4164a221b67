"""The report a person reads, on real runs: each known-bad fixture's plain report shows the user's
code line under the finding and no raw JSON; the HTML of a hang has one lane per rank and fetches
nothing; the trace has one track per rank; torchrun's own log lines stay off the screen.

The runs are shared with the other integration tests (same fixture and options, see conftest).
"""

from __future__ import annotations

import json
import linecache
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.integration

# fixture -> (options, the check whose finding must show its code line)
RENDERED = {
    "bad_grad_bypass.py": ((), "gradient-sync"),
    "hang_barrier_rank0.py": (("--hang-timeout", "5"), "collective-hang"),
    "bad_unused_missing.py": ((), "unused-parameters"),
    "bad_ckpt_load_no_barrier.py": ((), "rank0-checkpoint"),
}


def _report_text(output: str) -> str:
    """The final report: from its header line on (the script's own output before it may print anything)."""
    start = output.rfind("\nddpdoctor ")
    assert start >= 0, output[-3000:]
    return output[start:]


@pytest.mark.parametrize("fixture", sorted(RENDERED))
def test_the_plain_report_shows_the_code_line_and_no_json(run_check, fixture):
    options, check = RENDERED[fixture]
    run = run_check(fixture, *options)
    (finding,) = [f for f in run.findings(check) if f["severity"] in ("error", "warning")]
    location = finding["location"]
    code = linecache.getline(location["file"], location["line"]).rstrip()
    assert code.strip(), location
    text = _report_text(run.output)
    assert f"{location['line']} | {code}" in text, text
    assert "^^^" in text and "fix: " in text
    assert '{"' not in text and "': " not in text
    assert run.report["sources"][location["file"]][str(location["line"])] == code


def test_a_hang_shows_every_ranks_line_and_keeps_torchruns_log_off_screen(run_check):
    run = run_check("hang_barrier_rank0.py", "--hang-timeout", "5")
    text = _report_text(run.output)
    assert re.search(r"rank 0: waiting in barrier #\d+", text) and "rank 1: waiting in the backward pass" in text
    assert "dist.barrier()  # BUG: only rank 0 gets here" in text and "loss.backward()" in text
    assert "death signal" not in run.output and "api.py:" not in run.output
    log = run.report["launcher_log"]
    assert log and any("death signal" in line for line in log["lines"]) and log["path"]
    assert f"torchrun's own log ({len(log['lines'])} lines) is in {log['path']}" in text
    assert run.left_behind() == ["ddpdoctor"], "of its temporary files the run keeps only the log's folder"


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.lanes: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "g" and "lane" in (attrs.get("class") or "").split():
            self.lanes.append(attrs["data-rank"])
        self.urls += [attrs[a] for a in ("src", "href", "action") if attrs.get(a)]


def test_a_saved_hang_renders_as_html_and_trace(run_check, tmp_path):
    run = run_check("hang_barrier_rank0.py", "--hang-timeout", "5")
    saved = tmp_path / "hang.json"
    saved.write_text(json.dumps(run.report))
    html, trace = tmp_path / "hang.html", tmp_path / "hang.trace.json"
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "report", str(saved), "--plain", "--html", str(html),
                           "--trace", str(trace)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    page = _Page()
    page.feed(html.read_text())
    assert page.lanes == ["0", "1"] and page.urls == []
    text = html.read_text()
    assert "http://" not in text and "https://" not in text
    assert "first divergence" in text and "dist.barrier()" in text
    events = json.loads(trace.read_text())["traceEvents"]
    assert all({"ph", "ts", "pid", "tid"} <= set(e) for e in events)
    assert {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"} == {0, 1}
    assert any(re.fullmatch(r"barrier #\d+ \(first divergence\)", e["name"]) for e in events)


def test_env_markdown_is_a_block_to_paste_into_a_bug_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "env", "--markdown"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = proc.stdout
    assert text.startswith("<details open><summary>ddpdoctor env</summary>") and text.rstrip().endswith("</details>")
    for fragment in ("- OS: ", "- CPU: ", "- Python: ", "- Packages: ", "torch ", "| rank | host |", "| 0 |", "| 1 |"):
        assert fragment in text, text
    assert "[rank" not in text  # stdout carries the block alone


def test_help_follows_the_terminal_width_and_names_types_in_words(tmp_path):
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "check", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert max(len(line) for line in text.splitlines()) > 100  # not wrapped at 80 in a 160-column terminal
    assert "<list[str]>" not in text and "<int>" not in text and "<float>" not in text
    assert "--select IDS" in text and "--hang-timeout SECONDS" in text and "--html PATH" in text
    assert "/ --no-" not in text  # one flag per line; the --no-X overrides are hidden
