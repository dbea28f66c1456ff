"""Credentials stay off every command line on every host, and still reach the workers.

Two hosts in network namespaces with real sshd (netns_cluster.py); `hvdtrain launch` runs horovodrun
(Gloo over ssh) with HVDTRAIN_TEST_SECRET_TOKEN in its environment. While the job runs, a thread reads
/proc/*/cmdline of every process on the machine (the namespaces' processes are all visible from here).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.netns_cluster import IFACE, SSH_PORT
from support.paths import ROOT
from support.processes import show
from test_two_hosts import cluster, write_hostfile  # noqa: F401 - cluster is the fixture

SECRET_NAME = "HVDTRAIN_TEST_SECRET_TOKEN"
TRAIN = ["--model", "mlp", "--epochs", "2", "--threads", "1", "--log-interval", "10"]


class CommandLineWatch:
    """Reads every process's command line until stopped: who showed `needle`, and which namespaces were seen."""

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.leaks: list[tuple[str, str]] = []   # (netns, command line) of every sighting
        self.scans = 0
        self.namespaces: dict[str, set[str]] = {}   # netns -> command names seen there
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    netns = os.readlink(f"/proc/{pid}/ns/net")
                except OSError:  # gone meanwhile
                    continue
                if self.needle in cmdline:
                    shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
                    self.leaks.append((netns, f"pid {pid}: {shown}"))
                self.namespaces.setdefault(netns, set()).add(cmdline.split(b"\0")[0].decode(errors="replace"))
            self.scans += 1
            time.sleep(0.05)


def test_watch_sees_command_lines_inside_the_host_namespaces(cluster):  # noqa: F811
    value = secrets.token_hex(16)
    with CommandLineWatch(value) as watch:
        cluster.exec(cluster.workers[0], "sh", "-c", "sleep 1", value)
    # The first sighting may come before `ip netns exec` has switched namespaces (CI saw it once, the
    # same pid in the root namespace and then the host's): the watch must see it inside the host too.
    assert cluster.netns_id(cluster.workers[0]) in {netns for netns, _ in watch.leaks}, watch.leaks


def run_job(cluster, tmp_path: Path, value: str, launcher: list[str], backend: str = "gloo"):  # noqa: F811
    """Train on both hosts under `launcher` with SECRET_NAME=value set; (process, watch, seen_dir)."""
    hostfile = write_hostfile(tmp_path)
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    mpi_args = ["--mpi-args", f"-mca oob_tcp_if_include {IFACE}"] if backend == "mpi" else []
    launch = [*launcher, "-np", "2", "--hostfile", str(hostfile), "-p", str(SSH_PORT), "-i", str(cluster.key),
              "--network-interfaces", IFACE, "--start-timeout", "120", "--disable-cache", f"--{backend}",
              *mpi_args, sys.executable, str(ROOT / "tests/ranks/secret_then_train.py"), *TRAIN,
              "--run-dir", str(tmp_path / "runs"), "--name", "secret"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", WATCHED_NAME=SECRET_NAME,
               SEEN_DIR=str(seen_dir), **{SECRET_NAME: value})
    with CommandLineWatch(value) as watch:
        proc = subprocess.run(["ip", "netns", "exec", cluster.launcher.namespace, "unshare", "--uts", "sh", "-c",
                               'hostname launcher && exec "$0" "$@"', *launch],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, show(proc)
    summary = json.loads((tmp_path / "runs" / "secret" / "summary.json").read_text())
    assert summary["workers"] == 2 and len(set(summary["param_digests"])) == 1
    return proc, watch, seen_dir


def test_a_credential_reaches_the_workers_on_two_hosts_but_no_command_line(cluster, tmp_path):  # noqa: F811
    value = f"hvdt-{secrets.token_hex(16)}"
    proc, watch, seen_dir = run_job(cluster, tmp_path, value, [sys.executable, "-m", "hvdtrain", "launch",
                                                               "--secrets-dir", str(tmp_path / "secrets")])
    assert not watch.leaks, watch.leaks
    # The watch really looked at the workers: Python processes inside both host namespaces.
    for node in cluster.workers:
        assert any("python" in name for name in watch.namespaces.get(cluster.netns_id(node), ())), \
            (node.role, watch.namespaces.get(cluster.netns_id(node)))
    digest = hashlib.sha256(value.encode()).hexdigest()
    seen = sorted((json.loads(f.read_text()) for f in seen_dir.iterdir()), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["sha256"]) for r in seen] == [("0", "host1", digest), ("1", "host2", digest)]
    moved = next(line for line in proc.stdout.splitlines() if "go to the workers in" in line)
    assert SECRET_NAME in moved and value not in moved
    assert "reached the workers on horovodrun's command line" not in proc.stderr + proc.stdout
    assert list((tmp_path / "secrets").iterdir()) == [], "the secrets file outlived the job"
    print(f"scanned every /proc/*/cmdline {watch.scans} times during the run; no command line held the value")


def test_plain_horovodrun_gloo_leaks_it_and_rank_0_says_so_in_one_line(cluster, tmp_path):  # noqa: F811
    """Why `hvdtrain launch` exists: horovodrun (Gloo) writes every variable onto the ssh command lines."""
    value = f"hvdt-{secrets.token_hex(16)}"
    proc, watch, _ = run_job(cluster, tmp_path, value, [str(Path(sys.executable).parent / "horovodrun")])
    leaking = {netns for netns, _ in watch.leaks}
    assert {cluster.netns_id(node) for node in cluster.workers} <= leaking, watch.leaks[:3]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "reached the workers on horovodrun's command line" in line]
    assert len(warnings) == 1 and SECRET_NAME in warnings[0] and value not in warnings[0], warnings
