"""Tier 4: a script of your own on a real Slurm cluster (tests/support/slurm_cluster.py: munged, slurmctld and one
slurmd on loopback, all started here as root), submitted with the shipped recipe examples/cluster/own_script.sbatch
as it is, only its sizes overridden on sbatch's command line (one node, two tasks of one CPU, no GPU).

The script is a user's: its own model and data, hvdtrain.Trainer, and no line about Slurm, signals or resuming. What
`python -m hvdtrain` does under Slurm it gets from the Trainer (train/run_start.py, issue 52):
- `scontrol requeue` while it trains, after its first checkpoint: every rank stops at one step with a checkpoint,
  Slurm starts the job again, and the run (named slurm-<job id> by itself, resumed by itself) ends in its one folder
  with the weights of a run never stopped, to 1e-6;
- `scancel --batch --signal=USR1` (what the recipe's `--signal=B:USR1@120` sends before the time limit): a
  checkpoint at the step the ranks agree on, and the one line `hvdtrain: stopped by SIGUSR1 ...`, no traceback.

Three sbatch jobs (one run twice) of ~20-40 s each on 2 busy cores; the cluster starts in ~2 s. Skips with one line
when Slurm or munge is not installed (make setup installs them as root) or the daemons cannot start.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from support.paths import BIN, ROOT
from support.runs import assert_same_weights
from support.slurm_cluster import SlurmCluster, running_slurm
from support.waiting import wait_for

SBATCH = ROOT / "examples" / "cluster" / "own_script.sbatch"
OWN_SCRIPT = '''"""A user's own training script (the shape of examples/own_script/train.py), plus the test's hold: after
HOLD_AFTER training steps the model waits while the file HOLD_FILE exists, so the test acts at a known step."""
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain


class Held(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.steps = inner, 0

    def forward(self, x):
        if self.training and os.environ.get("HOLD_FILE"):
            self.steps += 1
            while self.steps > int(os.environ["HOLD_AFTER"]) and os.path.exists(os.environ["HOLD_FILE"]):
                time.sleep(0.1)
        return self.inner(x)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, (x[:, :5].sum(dim=1) > 0).long())


torch.manual_seed(0)
model = Held(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2)))
config = hvdtrain.load_config(None, sys.argv[1:])
with hvdtrain.Trainer(model, make_data(512, 0), make_data(128, 1), config=config,
                      loss_fn=nn.functional.cross_entropy) as trainer:
    trainer.fit()
'''
# 512 samples on 2 workers of 16: 16 steps an epoch, 32 in all; a checkpoint every 8 steps.
JOB = ["--batch-size", "16", "--epochs", "2", "--checkpoint-steps", "8", "--keep-checkpoints", "10", "--threads", "1",
       "--log-interval", "1", "--tensorboard", "false"]
HOLD_AFTER = 10     # training steps before every rank waits on the hold file (the step-8 checkpoint is written)
SIZES = ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-task=0")   # the one-node test cluster
JOB_TIMEOUT = 300
# How often a wait asks the controller: each squeue or sinfo is a fork, a munge credential and an RPC to slurmctld
# (wait_for's default 0.1 s made the waits on a running job cost a tenth of a core).
POLL_S = 0.5


@pytest.fixture(scope="module")
def slurm():
    with running_slurm() as cluster:
        yield cluster


def sbatch(cluster: SlurmCluster, folder: Path, args: list[str], **env: str) -> tuple[str, Path]:
    """Submit the recipe from `folder` (the user's: train.py is there, runs/ goes there) with the test cluster's sizes
    on sbatch's command line. Returns the job id and its output file."""
    (folder / "train.py").write_text(OWN_SCRIPT)
    log = folder / "job.out"
    proc = subprocess.run(["sbatch", "--parsable", *SIZES, f"--output={log}", str(SBATCH), "train.py", *args],
                          cwd=folder, capture_output=True, text=True, timeout=60,
                          env=cluster.env(HVDTRAIN_VENV=str(BIN.parent), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
                                          **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(";")[0], log


def output(log: Path) -> str:
    return log.read_text() if log.exists() else "(no job output)"


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    job, log = sbatch(slurm, folder, [*JOB, "--name", "ref"])
    state = slurm.wait_job(job, JOB_TIMEOUT)
    assert state == "COMPLETED", f"the uninterrupted reference job ended {state}:\n{output(log)[-3000:]}"
    assert "hvdtrain: 2 worker(s) (MPI, cpu)" in output(log), output(log)[-3000:]   # srun --mpi=pmix's world
    return folder / "runs" / "ref"


def held(slurm: SlurmCluster, folder: Path, args: list[str]) -> tuple[str, Path, Path]:
    """A job held after its step-8 checkpoint, running: (job id, its output, the hold file)."""
    hold = folder / "hold"
    hold.touch()
    job, log = sbatch(slurm, folder, args, HOLD_FILE=str(hold), HOLD_AFTER=str(HOLD_AFTER))
    wait_for(lambda: list(folder.glob("runs/*/checkpoints/ckpt-000000008.pt"))
             or slurm.job_state(job) not in ("PENDING", "RUNNING"), timeout=JOB_TIMEOUT,
             what="checkpoint 8 or the job's end", every=POLL_S)
    assert slurm.job_state(job) == "RUNNING", output(log)[-3000:]
    return job, log, hold


def test_scontrol_requeue_resumes_the_own_script_by_itself_to_the_uninterrupted_weights(slurm, tmp_path, uninterrupted):
    """No --name, no --resume, no signal handling in the script: the Trainer names the run slurm-<job id>, stops every
    rank at one step with a checkpoint on the requeue's TERM, and the restarted job (SLURM_RESTART_COUNT=1) resumes
    from it in the same folder."""
    job, log, hold = held(slurm, tmp_path, JOB)
    started = time.monotonic()
    slurm.client("scontrol", "requeue", job)
    hold.unlink()      # the restarted run counts its steps from its resume point: it must not hold again
    state = slurm.run_requeued(job, JOB_TIMEOUT)
    out = output(log)
    assert state == "COMPLETED", f"{state}\n{out[-4000:]}"
    stop = re.search(r"hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", out)
    assert stop and 8 < int(stop[1]) < 32, out[-4000:]
    assert "Traceback" not in out, out[-4000:]                       # a stop is one line, not a crash
    assert f"Slurm job {job}, requeued 1 time(s): --name slurm-{job} --resume auto" in out, out[-4000:]
    assert f"step {stop[1]} (" in out and "exactly where it stopped" in out, out[-4000:]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [f"slurm-{job}"]    # one run folder, both runs in it
    print(f"own script: requeue to completion {time.monotonic() - started:.0f} s")
    assert_same_weights(tmp_path / "runs" / f"slurm-{job}", uninterrupted)


def test_the_early_warning_usr1_makes_the_own_script_checkpoint_before_the_end(slurm, tmp_path):
    """What `#SBATCH --signal=B:USR1@120` sends, now: USR1 to the batch shell, which is srun (the recipe exec()s it),
    which forwards it to every task; the ranks agree on a step, write a checkpoint there and end with one line."""
    job, log, hold = held(slurm, tmp_path, [*JOB, "--name", "warned"])
    slurm.client("scancel", "--batch", "--signal=USR1", job)
    hold.unlink()
    state = slurm.wait_job(job, JOB_TIMEOUT)
    out = output(log)
    stop = re.search(r"hvdtrain: stopped by SIGUSR1 at step (\d+); checkpoint (\S+)", out)
    assert stop and 8 < int(stop[1]) < 32, f"{state}\n{out[-3000:]}"     # before the end (step 32)
    assert Path(stop[2]).name == f"ckpt-{int(stop[1]):09d}.pt" and (tmp_path / stop[2]).exists(), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "runs" / "warned" / "model.pt").exists()     # stopped, not finished
