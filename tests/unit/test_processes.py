"""Process-tree bookkeeping: the walk through the kernel's children files finds what a full scan does."""

from __future__ import annotations

import subprocess
import sys
import time

from ddpdoctor.supervisor import processes


def test_the_tree_walk_finds_every_descendant_as_the_scan_does():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "c = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])"
                             " for _ in range(2)]; "
                             "print('ready', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(processes.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        walked = processes.descendants(proc.pid)
        assert len(walked) == 2
        assert walked == processes._scan_descendants(proc.pid)
        assert all(processes.alive(pid, start) for pid, start in walked.items())
    finally:
        for pid in processes.descendants(proc.pid):
            processes.signal_all([(pid, None)], 9)
        proc.kill()
        proc.wait()
