"""Two hosts without a shared filesystem, for real: two network namespaces joined by a veth pair, each
with a private /tmp and its own hostname (two_hosts.py); one torchrun agent per host with c10d
rendezvous over the veth addresses, `ddpdoctor check` inside that launch. Every rank's evidence
reaches rank 0 over the job's store, so the report is complete; a hang is named with its host."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import two_hosts
from conftest import FIXTURES, skip_or_fail_in_ci

pytestmark = pytest.mark.integration

RDZV_PORT = 29400  # inside private network namespaces: no other job can hold it


@pytest.fixture(scope="module")
def hosts():
    reason = two_hosts.unavailable()
    if reason is not None:
        skip_or_fail_in_ci(f"no network namespaces here: {reason}")
    with two_hosts.TwoHosts() as made:
        yield made
    assert not [ns for ns in two_hosts._namespaces() if ns in made.ns.values()], "a namespace was left behind"


@pytest.fixture
def shared_dir():
    """Where the report goes: outside /tmp, which each host has its own of."""
    path = Path("/run") / f"ddpdoctor-two-hosts-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _check(hosts: two_hosts.TwoHosts, shared_dir: Path, *args: str, script_args: tuple[str, ...] = ()):
    first = hosts.names[0]

    def command(host: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts.address[first]}:{RDZV_PORT}",
                f"--rdzv-id=two-hosts-{os.getpid()}", f"--local-addr={hosts.address[host]}", "--max-restarts=0",
                "-m", "ddpdoctor", "check", *args, "--json", str(shared_dir / "report.json"), "--plain",
                *(["--", *script_args] if script_args else [])]

    env = {**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "ignore"}
    results = hosts.run({h: command(h) for h in hosts.names}, env=env, cwd=str(shared_dir), timeout_s=240)
    output = "\n".join(f"===== {h}\n{r.output}" for h, r in results.items())
    report = json.loads((shared_dir / "report.json").read_text())
    return results, output, report


def test_a_job_on_two_hosts_reports_both_with_a_rank_table(hosts, shared_dir):
    results, output, report = _check(hosts, shared_dir)
    assert report["outcome"] == "completed" and report["findings"] == [], output[-4000:]
    assert report["world_size"] == 4 and report["nnodes"] == 2 and report["missing_ranks"] == []
    by_node = {}
    for rank in report["ranks"]:
        by_node.setdefault(rank["node"], set()).add((rank["host"], rank["local_rank"]))
    assert sorted(by_node) == [0, 1]
    assert {host for node in by_node.values() for host, _ in node} == set(hosts.names)
    assert all(len({host for host, _ in node}) == 1 and {lr for _, lr in node} == {0, 1} for node in by_node.values())
    assert {e["host"] for e in report["environment"]} == set(hosts.names)  # every rank's evidence arrived
    assert {c["id"]: c["status"] for c in report["checks"]}["gradient-sync"] == "pass"
    reporter = next(r for r in results.values() if "verdict:" in r.output)
    for host in hosts.names:
        assert f"  {host}  " in reporter.output  # the per-node table: node, host, ranks
    assert sum(r.output.count("verdict:") for r in results.values()) == 1


def test_a_hang_on_the_second_host_is_named_with_its_host(hosts, shared_dir):
    results, output, report = _check(hosts, shared_dir, str(FIXTURES / "hang_barrier_last_rank.py"),
                                     "--hang-timeout", "5")
    assert report["outcome"] == "hung", output[-4000:]
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert finding["check"] == "collective-hang"
    last = max(report["ranks"], key=lambda r: r["rank"])
    first = min(report["ranks"], key=lambda r: r["rank"])
    assert last["host"] != first["host"]  # the last rank is on the second host
    assert re.search(rf"rank {last['rank']} on {last['host']} waits in barrier #\d+ at hang_barrier_last_rank.py",
                     finding["message"]), finding["message"]
    assert finding["evidence"]["ranks"][str(last["rank"])]["host"] == last["host"]
    assert finding["location"]["file"].endswith("hang_barrier_last_rank.py")
