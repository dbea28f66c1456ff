"""Tier 4: the shipped Slurm recipe on a real Slurm cluster (tests/support/slurm_cluster.py: munged, slurmctld and
one slurmd on loopback, all started here as root).

`sbatch examples/cluster/slurm.sbatch` runs its default launcher, `srun --mpi=pmix`: two workers on the
allocation's two slots, Horovod over MPI with the world from Slurm's PMIx, no sshd anywhere. Then
`scancel --signal=TERM` mid-epoch: both workers stop at the same step and write a checkpoint, and the same
sbatch with --resume auto ends with the weights of the run that was never stopped (to 1e-6).

Three sbatch jobs of ~30-40 s each on 2 busy cores; the cluster starts in ~2 s. Skips with one line when
Slurm or munge is not installed (make setup installs them as root) or the daemons cannot start.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from support.paths import BIN, PLUGINS_DIR, ROOT
from support.runs import STOPPABLE_DIGITS, assert_same_weights
from support.slurm_cluster import SlurmCluster, running_slurm
from support.waiting import wait_for

SBATCH = ROOT / "examples" / "cluster" / "slurm.sbatch"
# 1,437 digits on 2 workers, 32 a worker: 23 steps an epoch (the last one padded), 46 in all.
JOB = STOPPABLE_DIGITS
HOLD_AFTER = 12     # training steps before every rank waits on the hold file (the step-10 checkpoint is written)
JOB_TIMEOUT = 300
# How often a wait asks the controller: each squeue or sinfo is a fork, a munge credential and an RPC to slurmctld
# (wait_for's default 0.1 s made the waits on a running job cost a tenth of a core).
POLL_S = 0.5


@pytest.fixture(scope="module")
def slurm():
    with running_slurm() as cluster:
        yield cluster


def sbatch(cluster: SlurmCluster, log: Path, args: list[str], options: tuple[str, ...] = (), **env: str) -> str:
    """Submit the shipped recipe on one node with 2 tasks of 1 CPU (the script asks for 2 nodes of 2 x 4
    CPUs; options on sbatch's command line win over its #SBATCH lines), plus sbatch `options`. Returns the job id."""
    proc = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--output={log}",
         *options, str(SBATCH), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=cluster.env(HVDTRAIN_VENV=str(BIN.parent), PYTHONPATH=f"{ROOT}:{PLUGINS_DIR}", PYTHONUNBUFFERED="1",
                        **{"FAULTS_SLEEP_S": "0", **env}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(";")[0]


def run_job(cluster: SlurmCluster, log: Path, args: list[str]) -> tuple[str, str]:
    job = sbatch(cluster, log, args)
    state = cluster.wait_job(job, JOB_TIMEOUT)
    return state, log.read_text() if log.exists() else "(no job output)"


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    state, out = run_job(slurm, run_dir / "job.out", [*JOB, "--run-dir", str(run_dir), "--name", "ref"])
    # Every test here compares against its weights: a failed reference is named as such, with its output.
    assert state == "COMPLETED", f"the uninterrupted reference job ended {state}:\n{out[-3000:]}"
    return state, out, run_dir / "ref"


@pytest.mark.long    # the same recipe with srun trains on two nodes in test_slurm_hosts.py (default run)
def test_sbatch_recipe_trains_on_the_allocation_with_srun_and_no_ssh(uninterrupted):
    state, out, run = uninterrupted
    assert state == "COMPLETED", out[-3000:]
    assert "hvdtrain: 2 worker(s) (MPI, cpu)" in out, out[-3000:]     # Horovod's MPI controller, world from PMIx
    assert "horovodrun" not in out and "ssh" not in out, out[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == 46, summary


def held_job(slurm, tmp_path):
    """A job held after its step-10 checkpoint (the hold file), running: (hold, log, args, job id)."""
    hold, log = tmp_path / "hold", tmp_path / "first.out"
    hold.touch()
    args = [*JOB, "--run-dir", str(tmp_path), "--name", "run"]
    job = sbatch(slurm, log, args, FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER=str(HOLD_AFTER))
    ckpts = tmp_path / "run" / "checkpoints"
    wait_for(lambda: (ckpts / "ckpt-000000010.pt").exists() or slurm.job_state(job) not in ("PENDING", "RUNNING"),
             timeout=JOB_TIMEOUT, what="checkpoint 10 or the job's end", every=POLL_S)
    assert slurm.job_state(job) == "RUNNING", log.read_text()[-3000:]
    return hold, log, args, job


def test_scancel_term_mid_epoch_checkpoints_and_resume_equals_the_uninterrupted_run(slurm, tmp_path, uninterrupted):
    hold, log, args, job = held_job(slurm, tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    # As an admin or a preemption would: TERM to every task of the job's steps (not the batch shell).
    slurm.client("scancel", "--signal=TERM", job)
    hold.unlink()
    state = slurm.wait_job(job, JOB_TIMEOUT)
    out = log.read_text()
    stop = re.search(r"hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", out)
    assert stop and int(stop[1]) > 10, f"{state}\n{out[-3000:]}"    # its own checkpoint, after the step-10 one
    assert int(stop[1]) < 23, out[-3000:]                             # mid-epoch 1
    assert (ckpts / f"ckpt-{int(stop[1]):09d}.pt").exists(), sorted(p.name for p in ckpts.iterdir())

    state, out = run_job(slurm, tmp_path / "resume.out", [*args, "--resume", "auto"])
    assert state == "COMPLETED", out[-3000:]
    assert f"step {stop[1]} (" in out and "exactly where it stopped" in out, out[-3000:]
    assert_same_weights(tmp_path / "run", uninterrupted[2])


def test_scontrol_requeue_mid_epoch_resumes_by_itself_and_equals_the_uninterrupted_run(slurm, tmp_path, uninterrupted):
    """No --name, no --resume: the run is slurm-<job id>; `scontrol requeue` TERMs the job (every rank stops at
    the same step and checkpoints), Slurm starts the batch script again with SLURM_RESTART_COUNT=1, and that run
    defaults to --resume auto and goes on from the stop checkpoint."""
    hold, log = tmp_path / "hold", tmp_path / "job.out"
    hold.touch()
    job = sbatch(slurm, log, [*JOB, "--run-dir", str(tmp_path)], ("--requeue", "--open-mode=append"),
                 FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER=str(HOLD_AFTER))
    run = tmp_path / f"slurm-{job}"
    wait_for(lambda: (run / "checkpoints" / "ckpt-000000010.pt").exists()
             or slurm.job_state(job) not in ("PENDING", "RUNNING"), timeout=JOB_TIMEOUT,
             what="the checkpoint or the job's end", every=POLL_S)
    assert slurm.job_state(job) == "RUNNING", log.read_text()[-3000:]
    started = time.monotonic()
    slurm.client("scontrol", "requeue", job)
    hold.unlink()      # the restarted run counts its steps from its resume point: it must not hold again
    state = slurm.run_requeued(job, JOB_TIMEOUT)
    out = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{out[-4000:]}"
    stop = re.search(r"hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", out)
    assert stop and 10 < int(stop[1]) < 23, out[-4000:]            # its own checkpoint, mid-epoch 1
    assert f"Slurm job {job}, requeued 1 time(s): --name slurm-{job} --resume auto" in out, out[-4000:]
    # The restarted run goes on from the step it stopped at: no step lost beyond the stop itself.
    assert f"step {stop[1]} (" in out and "exactly where it stopped" in out, out[-4000:]
    print(f"requeue to completion: {time.monotonic() - started:.0f} s")
    assert_same_weights(run, uninterrupted[2])


@pytest.mark.long    # the same early warning, on two nodes and then requeued, is in test_slurm_hosts.py (default run)
def test_early_warning_usr1_to_the_batch_shell_reaches_every_task_and_checkpoints(slurm, tmp_path, uninterrupted):
    """What `#SBATCH --signal=B:USR1@T` sends, sent now: `scancel --batch --signal=USR1` signals the batch shell
    only, which is srun (the recipe exec()s it); srun forwards USR1 to every task, and they stop together."""
    hold, log, args, job = held_job(slurm, tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    slurm.client("scancel", "--batch", "--signal=USR1", job)
    hold.unlink()
    slurm.wait_job(job, JOB_TIMEOUT)
    out = log.read_text()
    stop = re.search(r"hvdtrain: stopped by SIGUSR1 at step (\d+); checkpoint ", out)
    assert stop and 10 < int(stop[1]) < 23, out[-3000:]
    assert (ckpts / f"ckpt-{int(stop[1]):09d}.pt").exists(), sorted(p.name for p in ckpts.iterdir())
    state, out = run_job(slurm, tmp_path / "resume.out", [*args, "--resume", "auto"])
    assert state == "COMPLETED", out[-3000:]
    assert f"step {stop[1]} (" in out and "exactly where it stopped" in out, out[-3000:]
    assert_same_weights(tmp_path / "run", uninterrupted[2])


@pytest.mark.long    # a 1-minute limit, Slurm's check every ~30 s, then the resume: over 2 minutes by design
def test_time_limit_term_checkpoints_before_kill_and_resume_equals_the_uninterrupted_run(slurm, tmp_path,
                                                                                         uninterrupted):
    """`--time=1` (Slurm's minimum) on a run that needs over 2 minutes (3 s a step): Slurm's own TERM at the
    limit (its check runs every ~30 s) stops every rank at one step with a checkpoint, inside KillWait (60 s
    in the fixture), the job ends TIMEOUT, and a rerun with --resume auto ends as if never stopped."""
    log = tmp_path / "first.out"
    args = [*JOB, "--run-dir", str(tmp_path), "--name", "run"]
    # The recipe's early warning (USR1 120 s before the end) would come at once with a 1-minute limit, before
    # the workers' handlers exist (Slurm may send it up to 60 s early): this test is about the limit's own TERM,
    # so the warning becomes a harmless CONT.
    job = sbatch(slurm, log, args, ("--time=1", "--signal=B:CONT@10"), FAULTS_SLEEP_S="3")
    state = slurm.wait_job(job, JOB_TIMEOUT)
    out = log.read_text()
    assert state == "TIMEOUT", f"{state}\n{out[-3000:]}"
    stop = re.search(r"hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", out)
    assert stop and 0 < int(stop[1]) < 46, out[-3000:]
    state, out = run_job(slurm, tmp_path / "resume.out", [*args, "--resume", "auto"])
    assert state == "COMPLETED", out[-3000:]
    assert f"step {stop[1]} (" in out and "exactly where it stopped" in out, out[-3000:]
    assert_same_weights(tmp_path / "run", uninterrupted[2])
