"""A real two-host run: horovodrun over ssh into two network namespaces, with Gloo and with MPI.

Nothing is mocked: real namespaces on a bridge, a real sshd per host, a hostfile written by
`hvdtrain hosts`, and `horovodrun -np 2 --hostfile F -p PORT -i KEY` started in a launcher
namespace. Needs root (CI runs as root; scripts/install-horovod installs openssh-server).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.netns_cluster import IFACE, SSH_PORT, running_cluster
from support.paths import BIN, ROOT
from support.processes import BACKENDS, show

from hvdtrain.data.sharding import steps_per_epoch

RAW_HOSTFILE = "# two hosts, one worker each\n\nhost1:1\nhost2 slots=1   # the second namespace\n"
# Two epochs: the claims (a rank per host, every step on both, equal replicas) hold for any length; accuracy is
# tests/multirank's to prove.
EPOCHS = 2
TRAIN = ["--model", "mlp", "--epochs", str(EPOCHS), "--threads", "1", "--log-interval", "10"]


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module (Gloo and MPI runs in turn): namespaces, keys and two sshd started once."""
    with running_cluster() as made:
        yield made


def write_hostfile(folder: Path) -> Path:
    """The launcher-facing hostfile, made by our own CLI from a commented one."""
    (folder / "hosts.txt").write_text(RAW_HOSTFILE)
    hostfile = folder / "hostfile"
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "hosts", "check", "hosts.txt", "-o", str(hostfile)],
                          cwd=folder, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, show(proc)
    assert hostfile.read_text() == "host1 slots=1\nhost2 slots=1\n"
    assert "total slots 2" in proc.stderr
    return hostfile


def home_ssh_state() -> dict[str, int] | None:
    """Names and modification times in ~/.ssh (None when it does not exist)."""
    folder = Path.home() / ".ssh"
    if not folder.exists():
        return None
    return {path.name: path.stat().st_mtime_ns for path in [folder, *folder.iterdir()]}


@BACKENDS
def test_two_hosts_each_rank_in_its_own_namespace_and_every_step_runs_on_both(cluster, tmp_path, backend):
    hostfile = write_hostfile(tmp_path)
    where_file = tmp_path / "where.json"
    ssh_before = home_ssh_state()
    mpi_args = ["--mpi-args", f"-mca oob_tcp_if_include {IFACE}"] if backend == "mpi" else []
    launch = [str(BIN / "horovodrun"), "-np", "2", "--hostfile", str(hostfile), "-p", str(SSH_PORT),
              "-i", str(cluster.key), "--network-interfaces", IFACE, "--start-timeout", "120",
              "--disable-cache", f"--{backend}", *mpi_args,
              sys.executable, str(ROOT / "tests/ranks/where_then_train.py"), *TRAIN,
              "--run-dir", str(tmp_path / "runs"), "--name", backend]
    # horovodrun forwards its environment to every worker: PYTHONPATH makes them import this tree.
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", WHERE_IFACE=IFACE,
               WHERE_FILE=str(where_file))
    started = time.monotonic()
    proc = subprocess.run(["ip", "netns", "exec", cluster.launcher.namespace, "unshare", "--uts", "sh", "-c",
                           'hostname launcher && exec "$0" "$@"', *launch],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, show(proc)

    where = sorted(json.loads(where_file.read_text()), key=lambda rank: rank["hostname"])
    by_role = {node.role: node for node in cluster.workers}
    assert [rank["hostname"] for rank in where] == ["host1", "host2"], where
    launcher_netns = cluster.exec(cluster.launcher, "readlink", "/proc/self/ns/net").stdout.strip()
    for rank in where:
        node = by_role[rank["hostname"]]
        assert rank["address"] == node.address, where
        assert rank["netns"] == cluster.netns_id(node), where  # the namespace that host's sshd serves
    assert len({rank["netns"] for rank in where} | {launcher_netns, os.readlink("/proc/self/ns/net")}) == 4

    summary = json.loads((tmp_path / "runs" / backend / "summary.json").read_text())
    assert summary["workers"] == 2
    print(f"two-host {backend} run: {seconds:.1f} s, val_acc {summary['val_acc']:.4f}, ranks {where}")
    # Exact instead of an accuracy bar: every step on both hosts and equal replicas (that 2 ranks train like one
    # with twice the batch is tests/multirank's equivalence test; here the point is the hosts, not the math).
    assert summary["rank_steps"] == [EPOCHS * steps_per_epoch(1438, 2, 32)] * 2, summary
    assert summary["val_samples"] == 359, summary
    assert len(summary["param_digests"]) == 2 and len(set(summary["param_digests"])) == 1
    assert home_ssh_state() == ssh_before, "something was written to ~/.ssh"
