"""What the report's views cost and how they look.

heartbeat: the watchdog's work per heartbeat (counters, a walk of the main thread's stack, its
classification, the JSON file), against the 0.5 s period: the share of one core it takes.
html: a hang fixture's --html page, screenshotted in a real headless browser (Debian's chromium)
so a person can look at it; the same command wrote docs/hang-report.png.

    python bench/report_views.py [--only heartbeat,html] [--screenshot PATH]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import FIXTURES, doctor, run  # noqa: E402

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def _deep(depth: int, ready: threading.Event, release: threading.Event) -> None:
    if depth:
        _deep(depth - 1, ready, release)
        return
    ready.set()
    release.wait()


def bench_heartbeat(rounds: int = 2000) -> None:
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.rank.watchdog import LiveState, write_json_atomic
    from ddpdoctor.schema import layout
    from ddpdoctor.schema.settings import RankSettings

    directory = tempfile.mkdtemp(prefix="ddpdoctor-bench-hb-")
    rec = Recorder(RankSettings(evidence_dir=directory))
    rec.set_activity("training")
    print("\nheartbeat: the watchdog's work per beat (a thread blocked 60 frames deep stands in for the main thread)")
    print(f"{'what':<44} {'per beat':>10} {'share of a core at 2 beats/s':>30}")
    ready, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_deep, args=(60, ready, release), daemon=True)
    worker.start()
    ready.wait()
    try:
        live = LiveState()
        path = layout.heartbeat_path(directory, rec.pid)

        def counters_only() -> None:
            write_json_atomic(path, rec.heartbeat().to_json())

        def with_state() -> None:
            beat = rec.heartbeat()
            state = live.sample(rec, sys._current_frames().get(worker.ident), beat.t)
            beat.state, beat.detail, beat.since, beat.where = (state["state"], state["detail"], state["since"],
                                                              state["where"])
            write_json_atomic(path, beat.to_json())

        def state_alone() -> None:
            live.sample(rec, sys._current_frames().get(worker.ident), time.time())

        for name, fn in (("before #17: counters + JSON file", counters_only),
                         ("now: + stack walk and classification", with_state),
                         ("the stack walk and classification alone", state_alone)):
            fn()
            started = time.perf_counter()
            for _ in range(rounds):
                fn()
            per_beat = (time.perf_counter() - started) / rounds
            print(f"{name:<44} {per_beat * 1e6:>8.0f} us {per_beat * 2 * 100:>29.3f} %")
    finally:
        release.set()
        rec.close()
        shutil.rmtree(directory, ignore_errors=True)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(html: Path, png: Path, *, width: int = 1280, height: int = 1060) -> subprocess.CompletedProcess:
    """The page as a headless browser draws it, offline (no network, a throw-away profile)."""
    browser = chromium()
    assert browser, "no chromium: apt-get install -y chromium"
    profile = tempfile.mkdtemp(prefix="ddpdoctor-chromium-")
    try:
        return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                               f"--window-size={width},{height}", html.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def bench_html(out: Path | None = None) -> None:
    cwd = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-html-"))
    page = cwd / "hang-report.html"
    shutil.copy(FIXTURES / "hang_barrier_rank0.py", cwd / "train.py")
    shutil.copy(FIXTURES / "_synthetic.py", cwd / "_synthetic.py")
    result = run(doctor(Path("train.py"), "--hang-timeout", "5", "-q", "--html", str(page),
                        "--trace", str(cwd / "hang.trace.json")), cwd=str(cwd))
    print(f"\nhtml: a hang fixture's page, {page.stat().st_size / 1024:.0f} KiB, exit {result.returncode}, "
          f"{result.wall_s:.1f} s to the verdict")
    if chromium() is None:
        print("html: no chromium here, no screenshot (apt-get install -y chromium)")
        return
    png = out or cwd / "hang-report.png"
    shot = screenshot(page, png)
    print(f"html: screenshot {png} ({png.stat().st_size / 1024:.0f} KiB)" if png.exists() else
          f"html: chromium failed: {shot.stderr[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="heartbeat,html")
    parser.add_argument("--screenshot", type=Path, help="where the html section's PNG goes")
    args = parser.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    if "heartbeat" in sections:
        bench_heartbeat()
    if "html" in sections:
        bench_html(args.screenshot)


if __name__ == "__main__":
    main()
