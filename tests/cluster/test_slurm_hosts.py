"""Tier 4: the shipped Slurm recipe on a real two-node Slurm cluster (tests/support/slurm_cluster.py
`running_slurm_hosts`: slurmctld in a launcher network namespace, one slurmd per namespace host, munge with
one key), as root.

- `sbatch examples/cluster/slurm.sbatch` with its default launcher (`srun --mpi=pmix`) on 2 nodes x 1 task:
  one worker on each host, Horovod over MPI with the world from Slurm's PMIx, and no sshd on any host.
- The same recipe with HVDTRAIN_LAUNCH=horovodrun: an sshd per host (the way tests/cluster/test_two_hosts.py
  runs them); horovodrun on the first node reaches both hosts.
- Pre-emption on 2 nodes: the early warning (`scancel --batch --signal=USR1`, what `#SBATCH
  --signal=B:USR1@T` sends) mid-epoch stops both ranks at one step with a checkpoint; `scontrol requeue`
  starts the job again, which resumes by itself (no --name, no --resume) and ends with the weights of the run
  that was never stopped (1e-6), the steps lost at most one log interval.
The one-node forms of the other signal paths (scancel TERM, time limit, requeue of a running job) are in
test_slurm.py. Each job here takes ~30-60 s on 2 busy cores; the cluster starts in ~2 s.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from support.netns_cluster import IFACE
from support.paths import BIN, PLUGINS_DIR, ROOT
from support.runs import assert_same_weights, records
from support.slurm_cluster import SlurmCluster, running_slurm_hosts
from support.waiting import wait_for

SBATCH = ROOT / "examples" / "cluster" / "slurm.sbatch"
LOG_INTERVAL = 1
# 1,437 digits on 2 workers, 32 a worker: 23 steps an epoch (the last one padded), 46 in all.
JOB = ["--dataset", "digits", "--val-fraction", "0.2005", "--batch-size", "32", "--model", "where_probe:where_mlp",
       "--hidden", "16", "--epochs", "2", "--checkpoint-steps", "10", "--keep-checkpoints", "10",
       "--threads", "1", "--log-interval", str(LOG_INTERVAL)]
HOLD_AFTER = 12
JOB_TIMEOUT = 300
# How often a wait asks the controller: each squeue or sinfo is a fork, a munge credential and an RPC to slurmctld
# (wait_for's default 0.1 s made the waits on a running job cost a tenth of a core).
POLL_S = 0.5
# Open MPI's TCP transport and its out-of-band channel on the hosts' bridge interface (the hosts also have lo).
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": IFACE, "OMPI_MCA_oob_tcp_if_include": IFACE}


@pytest.fixture(scope="module")
def slurm2():
    with running_slurm_hosts(2, sshd=False) as made:
        yield made


def sbatch(cluster: SlurmCluster, log: Path, args: list[str], options: tuple[str, ...] = (), **env: str) -> str:
    """Submit the shipped recipe on both nodes, 1 task of 1 CPU each (sbatch's command line wins over the
    script's #SBATCH lines), plus sbatch `options`. Returns the job id."""
    proc = subprocess.run(
        cluster.command("sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                        f"--output={log}", *options, str(SBATCH), *args),
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=cluster.env(HVDTRAIN_VENV=str(BIN.parent), PYTHONPATH=f"{ROOT}:{PLUGINS_DIR}", PYTHONUNBUFFERED="1",
                        **{"FAULTS_SLEEP_S": "0", **MPI_ENV, **env}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(";")[0]


def where(folder: Path) -> list[dict]:
    return sorted((json.loads(path.read_text()) for path in folder.glob("*.json")), key=lambda rank: rank["hostname"])


def assert_on_both_hosts(folder: Path, cluster: SlurmCluster, out: str) -> None:
    """One rank on each host, each in that host's own network namespace (the one its slurmd runs in)."""
    ranks = where(folder)
    assert [rank["hostname"] for rank in ranks] == ["host1", "host2"], f"{ranks}\n{out[-3000:]}"
    for rank in ranks:
        slurmd = cluster.daemons[f"slurmd-{rank['hostname']}"]
        assert rank["netns"] == os.readlink(f"/proc/{slurmd.pid}/ns/net"), ranks
    assert sorted(rank["rank"] for rank in ranks) == ["0", "1"], ranks


def sshd_pids(namespaces) -> list[int]:
    return [pid for node in namespaces.workers for pid in namespaces.pids(node, "sshd")]


@pytest.fixture(scope="module")
def uninterrupted(slurm2, tmp_path_factory):
    cluster, namespaces = slurm2
    folder = tmp_path_factory.mktemp("uninterrupted")
    (folder / "where").mkdir()
    assert sshd_pids(namespaces) == [], "an sshd runs on a host"
    started = time.monotonic()
    job = sbatch(cluster, folder / "job.out", [*JOB, "--run-dir", str(folder), "--name", "ref"],
                 WHERE_DIR=str(folder / "where"))
    state = cluster.wait_job(job, JOB_TIMEOUT)
    seconds = time.monotonic() - started
    no_sshd = sshd_pids(namespaces) == []
    out = (folder / "job.out").read_text() if (folder / "job.out").exists() else "(no job output)"
    return state, out, folder, seconds, no_sshd


def test_srun_lists_pmix(slurm2):
    """What docs/slurm.md tells a user to check before the default (srun --mpi=pmix) path."""
    proc = slurm2[0].client("srun", "--mpi=list")
    out = proc.stdout + proc.stderr
    assert "pmix" in out, out


def test_sbatch_recipe_trains_on_both_hosts_with_srun_and_no_sshd(slurm2, uninterrupted):
    state, out, folder, seconds, no_sshd = uninterrupted
    assert state == "COMPLETED", out[-3000:]
    assert no_sshd, "an sshd ran on a host during the job"
    assert "hvdtrain: 2 worker(s) (MPI, cpu)" in out, out[-3000:]     # Horovod's MPI controller, world from PMIx
    assert "horovodrun" not in out and "ssh" not in out, out[-3000:]
    assert_on_both_hosts(folder / "where", slurm2[0], out)
    summary = json.loads((folder / "ref" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == 46, summary
    print(f"2-node sbatch (srun): {seconds:.0f} s")


def test_early_warning_on_two_nodes_then_requeue_resumes_by_itself_exactly(slurm2, tmp_path, uninterrupted):
    cluster, _ = slurm2
    hold, log = tmp_path / "hold", tmp_path / "job.out"
    hold.touch()
    (tmp_path / "where").mkdir()
    started = time.monotonic()
    job = sbatch(cluster, log, [*JOB, "--run-dir", str(tmp_path)], ("--requeue", "--open-mode=append"),
                 FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER=str(HOLD_AFTER), WHERE_DIR=str(tmp_path / "where"))
    run = tmp_path / f"slurm-{job}"
    wait_for(lambda: (run / "checkpoints" / "ckpt-000000010.pt").exists()
             or cluster.job_state(job) not in ("PENDING", "RUNNING"), timeout=JOB_TIMEOUT,
             what="the checkpoint or the job's end", every=POLL_S)
    assert cluster.job_state(job) == "RUNNING", log.read_text()[-3000:]
    # What `#SBATCH --signal=B:USR1@T` sends: USR1 to the batch shell (srun, which the recipe exec()s), which
    # forwards it to the tasks on both nodes.
    cluster.client("scancel", "--batch", "--signal=USR1", job)
    hold.unlink()      # the restarted run counts its steps from its resume point: it must not hold again
    wait_for(lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "COMPLETING"), timeout=JOB_TIMEOUT,
             what="the job's end", every=POLL_S)
    out = log.read_text()
    stop = re.search(r"hvdtrain: stopped by SIGUSR1 at step (\d+); checkpoint ", out)
    assert stop and 10 < int(stop[1]) < 23, out[-3000:]               # its own checkpoint, mid-epoch 1
    stopped = int(stop[1])
    assert (run / "checkpoints" / f"ckpt-{stopped:09d}.pt").exists()
    assert_on_both_hosts(tmp_path / "where", cluster, out)
    done = [r["step"] for r in records(run, "train")]
    # The pre-empted job is requeued (as PreemptMode=REQUEUE or a site's USR1 handler would): no user action after.
    # Slurm holds a requeued job ~2 minutes before it may start again (its begin time); the test starts it once
    # both nodes have cleaned up after its first run (earlier, its new batch step fails to launch).
    wait_for(lambda: all(cluster.node_state(node.name) == "idle" for node in cluster.nodes), timeout=120,
             what="both nodes idle", every=POLL_S)
    cluster.client("scontrol", "requeue", job)
    time.sleep(2)
    cluster.client("scontrol", "update", f"JobId={job}", "StartTime=now")
    state = cluster.wait_job(job, JOB_TIMEOUT)
    out = log.read_text()
    assert state == "COMPLETED", f"{state}\n{out[-4000:]}"
    assert f"Slurm job {job}, requeued 1 time(s): --name slurm-{job} --resume auto" in out, out[-4000:]
    assert f"step {stopped} (" in out and "exactly where it stopped" in out, out[-4000:]
    # Lost work: the steps the first job did (its last logged step) beyond the step the requeued one resumed at.
    assert max(done) - stopped <= LOG_INTERVAL, (done, stopped)
    print(f"2-node USR1 + requeue to completion: {time.monotonic() - started:.0f} s; stopped at {stopped}, "
          f"last logged {max(done)}")
    assert_same_weights(run, uninterrupted[2] / "ref")


def test_sbatch_recipe_with_horovodrun_over_ssh_on_both_hosts(slurm2, tmp_path, uninterrupted):
    cluster, namespaces = slurm2
    namespaces.start_sshd()
    (tmp_path / "where").mkdir()
    started = time.monotonic()
    job = sbatch(cluster, tmp_path / "job.out", [*JOB, "--run-dir", str(tmp_path), "--name", "hr"],
                 HVDTRAIN_LAUNCH="horovodrun", HVDTRAIN_IFACE=IFACE, WHERE_DIR=str(tmp_path / "where"))
    state = cluster.wait_job(job, JOB_TIMEOUT)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else "(no job output)"
    assert state == "COMPLETED", out[-3000:]
    assert_on_both_hosts(tmp_path / "where", cluster, out)
    summary = json.loads((tmp_path / "hr" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == 46, summary
    print(f"2-node sbatch (horovodrun): {time.monotonic() - started:.0f} s")
    assert_same_weights(tmp_path / "hr", uninterrupted[2] / "ref")


def test_srun_with_no_mpi_trains_over_gloo_on_both_hosts(slurm2, tmp_path, uninterrupted):
    """`srun --mpi=none python -m hvdtrain`: no MPI, no horovodrun; hvdtrain sets Horovod's Gloo variables from
    SLURM_* and rank 0 serves the rendezvous on the first node (hvdtrain/cluster/slurm_gloo_env.py)."""
    cluster, _ = slurm2
    (tmp_path / "where").mkdir()
    started = time.monotonic()
    proc = subprocess.run(
        cluster.command("srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--mpi=none",
                        "--kill-on-bad-exit=1", str(BIN / "python"), "-m", "hvdtrain", *JOB,
                        "--run-dir", str(tmp_path), "--name", "gloo"),
        cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT,
        env=cluster.env(PYTHONPATH=f"{ROOT}:{PLUGINS_DIR}", PYTHONUNBUFFERED="1", FAULTS_SLEEP_S="0",
                        WHERE_DIR=str(tmp_path / "where")))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"Gloo over srun: rank 0 of 2, rendezvous on host1 \(10\.77\.0\.11:\d+\)", out), out[-3000:]
    assert re.search(r"2 worker\(s\) \(Gloo", out, re.IGNORECASE), out[-3000:]
    assert_on_both_hosts(tmp_path / "where", cluster, out)
    summary = json.loads((tmp_path / "gloo" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == 46, summary
    print(f"2-node srun --mpi=none (Gloo): {time.monotonic() - started:.0f} s")
