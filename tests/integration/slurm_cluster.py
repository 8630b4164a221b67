"""A real one-node Slurm on the test machine: munged, slurmctld and slurmd, started as root.

``SlurmCluster.start()`` installs Debian's ``slurm-wlm`` and ``munge`` if they are missing, makes the
munge key, starts munged, writes a private ``slurm.conf`` (clients find it through ``SLURM_CONF``),
starts slurmctld and slurmd and waits until ``sinfo`` shows the node idle. ``stop()`` ends exactly
the daemons it started, by their pid files. ``unavailable()`` says why Slurm cannot run here, for a
skip reason. Used by tests/integration/test_slurm.py; ``python slurm_cluster.py start|stop`` runs
the same steps by hand.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
WORK_DIR = Path("/run/ddpdoctor-slurm-test")  # the config and logs of the test cluster
MUNGE_PID = Path("/run/munge/munged.pid")
CTLD_PID = Path("/run/slurmctld.pid")
SLURMD_PID = Path("/run/slurmd.pid")

CONFIG = """\
ClusterName=local
SlurmctldHost={host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={ctld_pid}
SlurmdPidFile={slurmd_pid}
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmUser=root
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
SlurmctldLogFile={work}/slurmctld.log
SlurmdLogFile={work}/slurmd.log
KillWait=30
NodeName={host} CPUs=16 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=20000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _pid_alive(path: Path) -> Optional[int]:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _run(*cmd: str, env: Optional[dict] = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout)


def start_munge() -> bool:
    """Make the munge key if there is none and start munged unless one runs; True if it started it."""
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(128))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    if _pid_alive(MUNGE_PID) is not None:
        return False  # a munged that someone else started: used, never stopped
    for directory in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(directory, exist_ok=True)
        shutil.chown(directory, "munge", "munge")
    proc = _run("runuser", "-u", "munge", "--", "munged")
    if proc.returncode != 0:
        raise RuntimeError(f"munged did not start: {proc.stderr.strip()[-500:]}")
    return True


def _stop_pid_file(pid_file: Path) -> None:
    pid = _pid_alive(pid_file)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _pid_alive(pid_file) == pid:
        time.sleep(0.1)
    if _pid_alive(pid_file) == pid:
        os.kill(pid, signal.SIGKILL)


class SlurmCluster:
    def __init__(self) -> None:
        self.host = socket.gethostname().split(".")[0]
        self.conf = WORK_DIR / "slurm.conf"
        self.started: dict[str, Path] = {}  # daemon -> its pid file, for the ones this object started

    @property
    def env(self) -> dict[str, str]:
        """What a client (srun, sbatch, sinfo) needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @staticmethod
    def unavailable() -> Optional[str]:
        """Why no Slurm can be started here (None: it can), after installing the packages if needed."""
        if sys.platform != "linux":
            return "Slurm runs on Linux only"
        if os.geteuid() != 0:
            return "starting slurmctld, slurmd and munged needs root (the tests start a one-node Slurm themselves)"
        if not all(shutil.which(d) for d in DAEMONS):
            if not shutil.which("apt-get"):
                return "slurm-wlm and munge are not installed and there is no apt-get to install them"
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                if proc.returncode != 0:
                    return f"could not install {' '.join(PACKAGES)} with apt-get: {proc.stderr.strip()[-300:]}"
            if not all(shutil.which(d) for d in DAEMONS):
                return f"apt-get installed {' '.join(PACKAGES)} but {', '.join(DAEMONS)} are not all on PATH"
        return None

    def start(self, timeout_s: float = 60) -> None:
        WORK_DIR.mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text(CONFIG.format(host=self.host, ctld_pid=CTLD_PID, slurmd_pid=SLURMD_PID, work=WORK_DIR))
        for spool in ("/var/spool/slurmd", "/var/spool/slurmctld"):
            os.makedirs(spool, exist_ok=True)
        for daemon, pid_file, args in (("slurmctld", CTLD_PID, ["-i"]), ("slurmd", SLURMD_PID, [])):
            if _pid_alive(pid_file) is None:
                proc = _run(daemon, "-f", str(self.conf), *args, env=self.env)
                if proc.returncode != 0:
                    raise RuntimeError(f"{daemon} did not start: {proc.stderr.strip()[-500:]}")
                self.started[daemon] = pid_file
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            proc = _run("sinfo", "-h", "-o", "%t", env=self.env)
            state = proc.stdout.strip()
            if state == "idle":
                return
            if state in ("down", "drain", "down*", "drain*"):
                _run("scontrol", "update", f"NodeName={self.host}", "State=RESUME", env=self.env)
            time.sleep(0.5)
        raise RuntimeError(f"the node never became idle (sinfo: {state!r}); see {WORK_DIR}/slurmd.log")

    def _start_munge(self) -> None:
        if start_munge():
            self.started["munged"] = MUNGE_PID

    def stop(self) -> None:
        """Stop the daemons this object started (slurmd first), by their pid files."""
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid_file = self.started.pop(daemon, None)
            if pid_file is not None:
                _stop_pid_file(pid_file)


if __name__ == "__main__":
    cluster = SlurmCluster()
    if sys.argv[1:] == ["start"]:
        reason = cluster.unavailable()
        if reason:
            sys.exit(reason)
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    elif sys.argv[1:] == ["stop"]:
        cluster.started = {"slurmd": SLURMD_PID, "slurmctld": CTLD_PID, "munged": MUNGE_PID}
        cluster.stop()
    else:
        sys.exit("usage: slurm_cluster.py start|stop")


TWO_NODE_DIR = Path("/run/ddpdoctor-slurm-two-nodes")
TWO_NODE_CONFIG = """\
ClusterName=twonodes
SlurmctldHost={host}({gateway})
SlurmctldPort=6827
SlurmdPort=6828
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/ddpdoctor-slurmd-%n
StateSaveLocation=/var/spool/ddpdoctor-slurmctld-two-nodes
SlurmUser=root
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
SlurmctldLogFile={work}/slurmctld.log
SlurmdLogFile={work}/slurmd-%n.log
KillWait=30
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class TwoNodeSlurm:
    """Two Slurm nodes on one machine: each slurmd in its own network namespace (joined to the
    machine's by a bridge), mount namespace (a private /tmp) and UTS namespace (its hostname is its
    NodeName); slurmctld in the machine's namespace on other ports than SlurmCluster's, so both
    clusters can run at once. Clients use ``env`` (SLURM_CONF)."""

    NAMES = ("node-1", "node-2")
    SUBNET = "10.78.0"

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.host = socket.gethostname().split(".")[0]
        self.conf = TWO_NODE_DIR / "slurm.conf"
        self.bridge = f"ddpsb{tag}"
        self.ns = {name: f"ddpd-slurm-{os.getpid()}-{i}" for i, name in enumerate(self.NAMES, start=1)}
        self.address = {name: f"{self.SUBNET}.{i}" for i, name in enumerate(self.NAMES, start=1)}
        self.gateway = f"{self.SUBNET}.254"
        self._veths = [(f"dsh{tag}{i}", f"dsn{tag}{i}") for i in range(1, len(self.NAMES) + 1)]
        self._munge = False

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _ip(self, *args: str) -> None:
        proc = _run("ip", *args)
        if proc.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

    def start(self, timeout_s: float = 60) -> None:
        from two_hosts import RESOLV_CONF, hosts_file, private_tmp

        self.sweep_stale()
        try:
            TWO_NODE_DIR.mkdir(parents=True, exist_ok=True)
            self._munge = start_munge()
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            hosts = hosts_file({**self.address, self.host: self.gateway})
            for (name, ns), (outer, inner) in zip(self.ns.items(), self._veths):
                self._ip("netns", "add", ns)
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts)
                (etc / "resolv.conf").write_text(RESOLV_CONF)
                self._ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                self._ip("link", "set", outer, "master", self.bridge)
                self._ip("link", "set", outer, "up")
                self._ip("link", "set", inner, "netns", ns)
                self._ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", inner)
                self._ip("-n", ns, "link", "set", inner, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
            nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs=8 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=10000 "
                              "State=UNKNOWN" for n, a in self.address.items())
            self.conf.write_text(TWO_NODE_CONFIG.format(host=self.host, gateway=self.gateway, work=TWO_NODE_DIR,
                                                        nodes=nodes, names=",".join(self.NAMES)))
            os.makedirs("/var/spool/ddpdoctor-slurmctld-two-nodes", exist_ok=True)
            proc = _run("slurmctld", "-f", str(self.conf), "-i", env=self.env)
            if proc.returncode != 0:
                raise RuntimeError(f"slurmctld did not start: {proc.stderr.strip()[-500:]}")
            for name, ns in self.ns.items():
                os.makedirs(f"/var/spool/ddpdoctor-slurmd-{name}", exist_ok=True)
                etc = f"/etc/netns/{ns}"
                # nsenter joins the network namespace only (ip netns exec would remount /sys, hiding the
                # cgroup mounts slurmd needs); the mounts that ip netns exec makes are done by hand.
                script = (f"mount --bind {etc}/hosts /etc/hosts && mount --bind {etc}/resolv.conf /etc/resolv.conf "
                          f"&& {private_tmp()} && hostname {name} && exec slurmd -f {self.conf}")
                proc = _run("nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts", "--propagation",
                            "private", "sh", "-c", script, env=self.env)
                if proc.returncode != 0:
                    raise RuntimeError(f"slurmd of {name} did not start: {proc.stderr.strip()[-500:]}")
            deadline = time.monotonic() + timeout_s
            states = ""
            while time.monotonic() < deadline:
                states = _run("sinfo", "-h", "-N", "-o", "%t", env=self.env).stdout.split()
                if states == ["idle"] * len(self.NAMES):
                    return
                time.sleep(0.5)
            raise RuntimeError(f"the nodes never became idle (sinfo: {states}); see {TWO_NODE_DIR}")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def sweep_stale() -> None:
        """Remove what a test session killed before its clean-up left (namespaces, bridge, veths,
        daemons): the same subnet and ports would keep this cluster's nodes from ever answering."""
        from two_hosts import _alive, _kill_namespace, _namespaces

        for ns in _namespaces():
            parts = ns.split("-")
            if ns.startswith("ddpd-slurm-") and len(parts) == 4 and parts[2].isdigit() and not _alive(int(parts[2])):
                _kill_namespace(ns)
                tag = int(parts[2]) % 100000
                for link in (f"ddpsb{tag}", f"dsh{tag}{parts[3]}"):
                    _run("ip", "link", "delete", link)
        for name in TwoNodeSlurm.NAMES:
            _stop_pid_file(TWO_NODE_DIR / f"slurmd-{name}.pid")
        _stop_pid_file(TWO_NODE_DIR / "slurmctld.pid")

    def stop(self) -> None:
        for name in self.NAMES:
            _stop_pid_file(TWO_NODE_DIR / f"slurmd-{name}.pid")
        _stop_pid_file(TWO_NODE_DIR / "slurmctld.pid")
        for ns in self.ns.values():
            for pid in _run("ip", "netns", "pids", ns).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "delete", ns)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        _run("ip", "link", "delete", self.bridge)
        shutil.rmtree("/var/spool/ddpdoctor-slurmctld-two-nodes", ignore_errors=True)
        for name in self.NAMES:
            shutil.rmtree(f"/var/spool/ddpdoctor-slurmd-{name}", ignore_errors=True)
        if self._munge:
            _stop_pid_file(MUNGE_PID)
            self._munge = False
