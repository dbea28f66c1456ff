"""A real Slurm cluster on this machine for tests: munged, slurmctld and one slurmd, all ours.

One node on loopback (`NodeName=hvdtnode NodeAddr=127.0.0.1 CPUs=<cores>`), not one slurmd per
network-namespace host: the multi-host variant (slurmd under `nsenter --net` in each host namespace of
tests/netns_cluster.py, a private /tmp per node for PMIx) is described in shared/ENVIRONMENT.md and
left for later. Every daemon gets its own key, socket, config, spool, state, pid and log paths in one
temporary folder, and ports of its own: nothing under /etc, /run or /var is read or written, and the
machine's own munged or Slurm (if any) is never touched. Runs as root (slurmd starts job steps as the
submitting user). No cgroups: `proctrack/linuxproc`, `task/none`, `jobacct_gather/none`.

Clients (sbatch, srun, squeue, scancel) find the cluster through `SLURM_CONF`: use `cluster.env()`.
Tear-down kills exactly the daemons started here (by PID), then every process of a job step they left
behind (found by the `SLURM_CONF` in its environment), and removes the folder.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo")
NODE = "hvdtnode"
PARTITION = "hvdt"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_conf(folder: Path, cpus: int, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The whole configuration: one node, one partition, no accounting, no cgroups."""
    return "\n".join([
        "ClusterName=hvdtrain-test",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'ctld-state'}",
        f"SlurmdSpoolDir={folder / 'slurmd-spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
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
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@dataclass
class SlurmCluster:
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
        for name in ("ctld-state", "slurmd-spool"):
            (self.folder / name).mkdir()
        self.conf.write_text(slurm_conf(self.folder, self.cpus, free_port(), free_port(), self.munge_socket))
        self._spawn("slurmctld", [SLURMCTLD, "-D", "-i", "-f", str(self.conf)])
        self._wait(self._controller_answers, "slurmctld", self.folder / "slurmctld.log", timeout)
        self._spawn("slurmd", [SLURMD, "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_idle, "slurmd", self.folder / "slurmd.log", timeout)

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
        proc = subprocess.run(list(cmd), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def _controller_answers(self) -> bool:
        return self.client("sinfo", "-h", check=False, timeout=10).returncode == 0

    def _node_idle(self) -> bool:
        state = self.client("sinfo", "-h", "-n", NODE, "-o", "%t", check=False, timeout=10).stdout.strip()
        return state in ("idle", "mix", "alloc")

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

    def stop(self) -> list[str]:
        """Kill what was started here, and any job step process left behind. Returns what was killed late."""
        leftovers: list[str] = []
        for name in ("slurmd", "slurmctld", "munged"):   # slurmd first: it ends its steps on SIGTERM
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
def running_slurm() -> Iterator[SlurmCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster()
    try:
        try:
            cluster.start()
        except SlurmStartError as err:
            pytest.skip(f"Slurm cannot start here: {err}")
        yield cluster
    finally:
        cluster.stop()
