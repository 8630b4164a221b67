"""Two "hosts" on one machine: two network namespaces joined by a veth pair, each command in its own
mount namespace (a private /tmp) and UTS namespace (its own hostname). Needs root and iproute2.

    with TwoHosts() as hosts:
        results = hosts.run({"host-a": cmd_a, "host-b": cmd_b}, timeout_s=120)

``hosts.address[name]`` is each host's address on the veth link; both names resolve on both hosts
(``ip netns exec`` puts /etc/netns/<ns>/hosts over /etc/hosts, and a resolv.conf that fails fast
instead of waiting for a DNS server the namespace cannot reach). Everything is removed on exit, on
failure and, for namespaces a killed run left behind, at the next start (their names carry the
creating process's pid). Used by tests/integration/test_two_hosts.py and bench/two_hosts.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PREFIX = "ddpd-2h"
NETNS_ETC = "/etc/netns"
SUBNET = "10.77.{k}.{i}"


@dataclass
class HostResult:
    host: str
    returncode: int
    output: str


def hosts_file(addresses: dict[str, str]) -> str:
    """/etc/hosts for a namespace: every host by name, also as the IPv4-mapped IPv6 address that
    c10d's dual-stack sockets look up in reverse (else each lookup asks a DNS server)."""
    lines = ["127.0.0.1 localhost", "::1 localhost", "::ffff:127.0.0.1 localhost"]
    for name, address in addresses.items():
        lines += [f"{address} {name}", f"::ffff:{address} {name}"]
    return "\n".join(lines) + "\n"


RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in ``ns``, then delete it (its veth end goes with it) and its /etc files."""
    for _ in range(3):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    _ip("netns", "delete", ns, check=False)
    shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)


def _installed_under_tmp() -> list[str]:
    """The checkout and the Python environment, where they live under /tmp (a checkout made there)."""
    paths = {str(Path(__file__).resolve().parents[2]), os.path.realpath(sys.prefix)}
    return sorted(p for p in paths if p.startswith("/tmp/") and not any(
        p != q and p.startswith(q + "/") for q in paths))


def private_tmp() -> str:
    """Shell that gives a fresh mount namespace an empty /tmp (the host's own, shared with no other
    host), keeping visible only what a host would have installed: the checkout and the Python
    environment when they live under /tmp. They are parked on a tmpfs over /mnt (inside the
    namespace, nothing outside changes) while the new /tmp is mounted, then bound back."""
    keep = _installed_under_tmp()
    if not keep:
        return "mount -t tmpfs tmpfs /tmp"
    park = ["mount -t tmpfs tmpfs /mnt"]
    back = []
    for i, path in enumerate(keep):
        park += [f"mkdir /mnt/keep{i}", f"mount --bind {shlex.quote(path)} /mnt/keep{i}"]
        back += [f"mkdir -p {shlex.quote(path)}", f"mount --bind /mnt/keep{i} {shlex.quote(path)}"]
    return " && ".join([*park, "mount -t tmpfs tmpfs /tmp", *back])


def sweep_stale() -> None:
    """Delete the namespaces of runs whose process is gone (killed before it could clean up)."""
    for ns in _namespaces():
        parts = ns.split("-")
        if ns.startswith(PREFIX + "-") and len(parts) == 4 and parts[2].isdigit() and not _alive(int(parts[2])):
            _kill_namespace(ns)


def unavailable() -> Optional[str]:
    """Why two network namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network and mount namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "delete", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


class TwoHosts:
    def __init__(self, names: tuple[str, str] = ("host-a", "host-b"), *, subnet: int = 77) -> None:
        self.names = names
        tag = f"{PREFIX}-{os.getpid()}"
        self.ns = {name: f"{tag}-{i}" for i, name in enumerate(names)}
        self.address = {name: SUBNET.format(k=subnet % 250, i=i + 1) for i, name in enumerate(names)}
        self._veth = (f"d2h{os.getpid() % 100000}a", f"d2h{os.getpid() % 100000}b")
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "TwoHosts":
        sweep_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        hosts = hosts_file({n: self.address[n] for n in self.names})
        for name, ns in self.ns.items():
            _ip("netns", "add", ns)
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                f.write(hosts)
            with open(os.path.join(NETNS_ETC, ns, "resolv.conf"), "w") as f:
                # The machine's DNS server is unreachable from the namespace: every lookup that the
                # hosts file does not answer (c10d's reverse lookups) would wait out the resolver's timeout.
                f.write(RESOLV_CONF)
            _ip("-n", ns, "link", "set", "lo", "up")
        a, b = self.names
        _ip("link", "add", self._veth[0], "type", "veth", "peer", "name", self._veth[1])
        for name, veth in zip(self.names, self._veth):
            _ip("link", "set", veth, "netns", self.ns[name])
            _ip("-n", self.ns[name], "addr", "add", f"{self.address[name]}/24", "dev", veth)
            _ip("-n", self.ns[name], "link", "set", veth, "up")

    def command(self, host: str, cmd: list[str]) -> list[str]:
        """``cmd`` run on ``host``: its network namespace, a fresh mount namespace with an empty /tmp,
        a UTS namespace with ``host`` as hostname."""
        script = f'{private_tmp()} && hostname {host} && exec "$@"'
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--mount", "--uts", "--propagation", "private",
                "sh", "-c", script, "sh", *cmd]

    def run(self, commands: dict[str, list[str]], *, env: Optional[dict] = None, cwd: Optional[str] = None,
            timeout_s: float = 180) -> dict[str, HostResult]:
        """Run one command per host at once; wait for both (killing both at ``timeout_s``)."""
        procs = {}
        for host, cmd in commands.items():
            proc = subprocess.Popen(self.command(host, cmd), env=env, cwd=cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self._procs.append(proc)
            procs[host] = proc
        deadline = time.monotonic() + timeout_s
        results = {}
        try:
            for host, proc in procs.items():
                output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                results[host] = HostResult(host, proc.returncode, output)
        except subprocess.TimeoutExpired:
            self.close()
            raise
        return results

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in self.ns.values():
            if ns in _namespaces():
                _kill_namespace(ns)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _ip("link", "delete", self._veth[0], check=False)  # gone with its namespace, unless creation failed halfway
