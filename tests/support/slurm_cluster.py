"""A real Slurm cluster on this machine for tests: munged, slurmctld and slurmd(s), all ours.

Two shapes, one class:
- one node on loopback (`running_slurm()`): `NodeName=hvdtnode NodeAddr=127.0.0.1`, every daemon in the
  root network namespace;
- one node per network-namespace host of tests/support/netns_cluster.py (`running_slurm_hosts(2)`): slurmctld in
  the launcher namespace (reachable from every host over the bridge), one slurmd per host namespace with its
  own NodeName (host1, host2...), NodeAddr (the host's bridge address), spool, pid, log and tmp folder. Each
  slurmd runs under `nsenter --net` (not `ip netns exec`, which remounts /sys and hides the cgroup mounts
  slurmd reads) inside `unshare --mount --uts`: its own host name, and that host's /etc/hosts and ssh client
  config bind-mounted over the machine's, so the jobs it starts resolve host names and ssh the way the
  namespace's own processes do. PMIx's client folder is `<TmpFS>/spmix_appdir_<uid>_<job>.<step>`: TmpFS
  holds %n (a folder per node), or two nodes sharing this filesystem would collide on it ("File exists").
One munged for all (its socket is a path: every namespace reaches it), one key. Every daemon gets its own
config, spool, state, pid and log paths in one temporary folder and ports of its own: nothing under /etc,
/run or /var is written, and the machine's own munged or Slurm (if any) is never touched. Runs as root
(slurmd starts job steps as the submitting user). No cgroups: `proctrack/linuxproc`, `task/none`.

Clients (sbatch, srun, squeue, scancel) find the cluster through `SLURM_CONF` (`cluster.env()`) and, on the
namespace cluster, run in the launcher namespace (`cluster.command(...)`). Tear-down kills exactly the daemons
started here (by PID), then every process of a job step they left behind (found by the `SLURM_CONF` in its
environment), and removes the folder; the namespace cluster then kills what is left in its namespaces.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .netns_cluster import SSH_PORT, NamespaceCluster, running_cluster
from .ports import free_port
from .waiting import wait_for

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo")
NODE = "hvdtnode"
PARTITION = "hvdt"


@dataclass
class SlurmNode:
    name: str                       # NodeName, and the host name its jobs see
    address: str                    # NodeAddr: where slurmctld and the other nodes reach its slurmd
    netns: str | None = None        # `ip netns` name; None: the root namespace
    etc: Path | None = None         # the namespace's /etc/netns folder (hosts, ssh/ssh_config) to mount



def slurm_conf(folder: Path, nodes: list[SlurmNode], cpus: int, controller: str, ports: tuple[int, int],
               munge_socket: Path) -> str:
    """The whole configuration: the nodes, one partition, no accounting, no cgroups. `controller`: the address
    slurmctld listens on (its name is `localhost`, which slurmctld accepts as its own whatever the host name)."""
    return "\n".join([
        "ClusterName=hvdtrain-test",
        f"SlurmctldHost=localhost({controller})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'ctld-state'}",
        f"SlurmdSpoolDir={folder / 'spool-%n'}",
        f"TmpFS={folder / 'tmp-%n'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        # A job's TERM-then-KILL grace (scancel, time limit): long enough for a checkpoint under load.
        "KillWait=60",
        "InactiveLimit=0",
        "MinJobAge=600",
        *(f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name if node.netns else 'localhost'} "
          f"CPUs={cpus} State=UNKNOWN" for node in nodes),
        f"PartitionName={PARTITION} Nodes={','.join(node.name for node in nodes)} Default=YES MaxTime=INFINITE "
        "State=UP",
        "",
    ])


@dataclass
class SlurmCluster:
    nodes: list[SlurmNode] = field(default_factory=lambda: [SlurmNode(NODE, "127.0.0.1")])
    controller: str = "127.0.0.1"             # slurmctld's address
    controller_netns: str | None = None       # where slurmctld and the clients run; None: the root namespace
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hvdt-slurm-")))
    cpus: int = field(default_factory=lambda: os.cpu_count() or 2)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.folder / "munge" / "munge.socket"

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ for a Slurm client of this cluster (no SLURM_* of an enclosing job leaks in)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(SLURM_CONF=str(self.conf), **extra)
        return env

    def command(self, *cmd: str) -> list[str]:
        """`cmd` as a client of this cluster runs it: in the controller's network namespace, if it has one."""
        return _in_netns(self.controller_netns, list(cmd))

    def start(self, timeout: float = 60) -> None:
        munge = self.folder / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", [MUNGED, "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged", munge / "munged.log", timeout)
        (self.folder / "ctld-state").mkdir()
        for node in self.nodes:
            for name in ("spool", "tmp"):
                (self.folder / f"{name}-{node.name}").mkdir(mode=0o1777 if name == "tmp" else 0o755)
        self.conf.write_text(slurm_conf(self.folder, self.nodes, self.cpus, self.controller,
                                        (free_port(), free_port()), self.munge_socket))
        self._spawn("slurmctld", self.command(SLURMCTLD, "-D", "-i", "-f", str(self.conf)))
        self._wait(self._controller_answers, "slurmctld", self.folder / "slurmctld.log", timeout)
        for node in self.nodes:
            self._spawn(f"slurmd-{node.name}", self._slurmd_command(node))
        for node in self.nodes:
            self._wait(lambda node=node: self.node_state(node.name) in ("idle", "mix", "alloc"),
                       f"slurmd-{node.name}", self.folder / f"slurmd-{node.name}.log", timeout)

    def _slurmd_command(self, node: SlurmNode) -> list[str]:
        slurmd = [SLURMD, "-D", "-N", node.name, "-f", str(self.conf)]
        if node.netns is None:
            return slurmd
        assert node.etc is not None
        # nsenter -> unshare -> sh all exec in turn: the Popen pid is slurmd's. unshare's mount namespace is
        # private, so these binds stay inside it (and the job steps slurmd forks).
        script = ('mount --bind "$1/hosts" /etc/hosts && mount --bind "$1/ssh/ssh_config" /etc/ssh/ssh_config '
                  '&& hostname "$2" && shift 2 && exec "$@"')
        return _in_netns(node.netns, ["unshare", "--mount", "--uts", "sh", "-c", script, "sh", str(node.etc),
                                      node.name, *slurmd])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = (self.folder / f"{name}.out").open("w")
        self.daemons[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=self.env(), start_new_session=True)

    def _wait(self, ready, name: str, log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            proc = self.daemons[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SlurmStartError(f"{name} did not start (exit {proc.poll()}): " + self.tail(name, log))
            time.sleep(0.3)

    def tail(self, name: str, log: Path | None = None, lines: int = 15) -> str:
        texts = []
        for path in (self.folder / f"{name}.out", log):
            if path is not None and path.exists():
                texts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return " | ".join(texts) or "(no output)"

    def client(self, *cmd: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command(*cmd), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def _controller_answers(self) -> bool:
        return self.client("sinfo", "-h", check=False, timeout=10).returncode == 0

    def node_state(self, name: str) -> str:
        return self.client("sinfo", "-h", "-n", name, "-o", "%t", check=False, timeout=10).stdout.strip()

    def job_state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETED, CANCELLED, FAILED... ('' once the controller forgot the job)."""
        return self.client("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T", check=False).stdout.strip()

    def wait_job(self, job_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.5)
        self.client("scancel", job_id, check=False)
        raise AssertionError(f"job {job_id} still {self.job_state(job_id)} after {timeout:.0f} s")

    def run_requeued(self, job_id: str, timeout: float) -> str:
        """After `scontrol requeue`: start the job again as soon as it is pending on an idle node (not after Slurm's
        ~2 minute begin-time hold; earlier, its restarted batch step fails to launch), then wait for its end state."""
        # Every 0.5 s, as wait_job: each poll is two client calls (a fork, a munge credential and a controller RPC).
        wait_for(lambda: self.job_state(job_id) == "PENDING" and self.node_state(NODE) == "idle", timeout=timeout,
                 what="the requeued job pending on an idle node", every=0.5)
        self.client("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        return self.wait_job(job_id, timeout)

    def stop(self) -> list[str]:
        """Kill what was started here, and any job step process left behind. Returns what was killed late."""
        leftovers: list[str] = []
        slurmds = [name for name in self.daemons if name.startswith("slurmd")]
        for name in (*slurmds, "slurmctld", "munged"):   # slurmd first: it ends its steps on SIGTERM
            proc = self.daemons.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                leftovers.append(name)
        leftovers += _kill_job_processes(self.conf)
        shutil.rmtree(self.folder, ignore_errors=True)
        return leftovers


class SlurmStartError(Exception):
    """The cluster could not start here (tests skip with this one line)."""


def _in_netns(netns: str | None, cmd: list[str]) -> list[str]:
    return cmd if netns is None else ["nsenter", f"--net=/run/netns/{netns}", *cmd]


def _kill_job_processes(conf: Path) -> list[str]:
    """Job step processes (slurmstepd, the job's own) whose environment names our SLURM_CONF."""
    needle = f"SLURM_CONF={conf}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(f"{entry.name} {cmdline}")
        except (OSError, ProcessLookupError):
            continue
    return killed


def skip_reason() -> str | None:
    """One line saying why a real Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm cluster needs root (slurmd starts job steps as the submitting user)"
    for daemon, package in ((MUNGED, "munge"), (SLURMCTLD, "slurm-wlm"), (SLURMD, "slurm-wlm")):
        if not os.access(daemon, os.X_OK):
            return f"no {daemon}: install Debian's {package} (make setup does, as root)"
    missing = [tool for tool in CLIENTS if shutil.which(tool) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH (Debian: slurm-client)"
    return None


@contextmanager
def _started(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    try:
        try:
            cluster.start()
        except SlurmStartError as err:
            pytest.skip(f"Slurm cannot start here: {err}")
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def running_slurm() -> Iterator[SlurmCluster]:
    """One node on loopback."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with _started(SlurmCluster()) as cluster:
        yield cluster


@contextmanager
def running_slurm_hosts(hosts: int = 2, sshd: bool = False) -> Iterator[tuple[SlurmCluster, NamespaceCluster]]:
    """One node per namespace host (host1..hostN), slurmctld in the launcher namespace; with `sshd`, an sshd
    per host too (NamespaceCluster.start_sshd() starts them later). Skips with one line where it cannot run."""
    reason = skip_reason() or (None if shutil.which("nsenter") else "no nsenter on PATH (Debian: util-linux)")
    if reason:
        pytest.skip(reason)
    with running_cluster(hosts=hosts, sshd=sshd) as namespaces:
        for node in namespaces.workers:
            # A job's ssh (horovodrun's) reaches the hosts' sshd the way a site's does: no -p/-i on its command line.
            with (Path("/etc/netns") / node.namespace / "ssh" / "ssh_config").open("a") as config:
                config.write(f"    Port {SSH_PORT}\n    IdentityFile {namespaces.key}\n")
        nodes = [SlurmNode(node.role, node.address, node.namespace, Path("/etc/netns") / node.namespace)
                 for node in namespaces.workers]
        cluster = SlurmCluster(nodes, namespaces.launcher.address, namespaces.launcher.namespace,
                               cpus=1)
        with _started(cluster):
            yield cluster, namespaces
