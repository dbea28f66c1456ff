"""Tier 4: `hvdtrain tune --launcher srun` on a real Slurm cluster (one node, tests/support/slurm_cluster.py).

`sbatch examples/cluster/tune.sbatch` runs a study of three small trials, each a job step of two workers
started by srun (Gloo from SLURM_*). The same study again, requeued (`scontrol requeue`) while its second
trial is mid-way (held after its step-10 checkpoint): the requeued job finds its study in
tune/slurm-<job id>, runs the stopped trial's parameters again from its start, and ends with the same best
trial (parameters and value) as the study that was never stopped.

Two sbatch jobs of three and four trials (~40-50 s a trial on 2 busy cores) plus the requeue: 368 s in all
(147 s the uninterrupted study, 212 s the requeued one), hence `long`. The one-node cluster's name does not
resolve, so the trials use `--backend mpi` (srun --mpi=pmix), not Gloo over srun.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.paths import BIN, PLUGINS_DIR, ROOT
from support.slurm_cluster import SlurmCluster, running_slurm
from support.waiting import wait_for

SBATCH = ROOT / "examples" / "cluster" / "tune.sbatch"
SPACE = "lr: {type: float, low: 0.01, high: 0.5, log: true}\n"
# 1,437 digits on 2 workers, 32 a worker: 23 steps an epoch, 46 a trial.
STUDY = ["--trials", "3", "--backend", "mpi", "--sampler", "random", "--sampler-seed", "3", "--pruner", "none",
         "--dataset", "digits", "--val-fraction", "0.2005", "--batch-size", "32", "--model", "faults:slow_mlp",
         "--hidden", "16", "--epochs", "2", "--checkpoint-steps", "10", "--threads", "1", "--log-interval", "1"]
JOB_TIMEOUT = 400

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def slurm():
    with running_slurm() as cluster:
        yield cluster


def submit(cluster: SlurmCluster, folder: Path, **env: str) -> tuple[str, Path]:
    """The shipped tune recipe on one node, 2 tasks of 1 CPU: (job id, its output file)."""
    (folder / "space.yaml").write_text(SPACE)
    log = folder / "job.out"
    proc = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--output={log}",
         str(SBATCH), "--space", str(folder / "space.yaml"), "--dir", str(folder / "tune"), *STUDY],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=cluster.env(HVDTRAIN_VENV=str(BIN.parent), PYTHONPATH=f"{ROOT}:{PLUGINS_DIR}", PYTHONUNBUFFERED="1",
                        **{"FAULTS_SLEEP_S": "0", **env}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(";")[0], log


def best(study: Path) -> tuple[dict, float, list[dict]]:
    rows = json.loads((study / "trials.json").read_text())
    done = [r for r in rows if r["state"] == "COMPLETE"]
    top = max(done, key=lambda r: r["value"])
    return top["params"], top["value"], rows


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    started = time.monotonic()
    job, log = submit(slurm, folder)
    state = slurm.wait_job(job, JOB_TIMEOUT)
    out = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{out[-4000:]}"
    print(f"uninterrupted study: {time.monotonic() - started:.0f} s")
    return folder / "tune" / f"slurm-{job}", out


def test_tune_on_slurm_runs_each_trial_as_a_job_step(uninterrupted):
    study, out = uninterrupted
    params, value, rows = best(study)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 3, rows
    assert "hvdtrain: 2 worker(s) (MPI, cpu)" in (study / "trials" / "trial-0000.log").read_text()   # PMIx
    assert "horovodrun" not in (study / "trials" / "trial-0000.log").read_text()
    assert "tune: best trial" in out and value > 0.5, out[-3000:]


def test_a_requeued_study_resumes_and_finds_the_same_best_trial(slurm, tmp_path, uninterrupted):
    hold = tmp_path / "hold"
    # Every trial's workers would wait at step 12 while `hold` exists: it is made once trial 1 starts.
    job, log = submit(slurm, tmp_path, FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER="12")
    study = tmp_path / "tune" / f"slurm-{job}"
    wait_for(lambda: (study / "trials" / "trial-0001.yaml").exists()
             or slurm.job_state(job) not in ("PENDING", "RUNNING"), timeout=JOB_TIMEOUT,
             what="the checkpoint or the job's end")
    hold.touch()
    ckpt = study / "trials" / "trial-0001" / "checkpoints" / "ckpt-000000010.pt"
    wait_for(lambda: ckpt.exists() or slurm.job_state(job) not in ("PENDING", "RUNNING"), timeout=JOB_TIMEOUT,
             what="the checkpoint or the job's end")
    assert slurm.job_state(job) == "RUNNING", log.read_text()[-3000:]
    started = time.monotonic()
    slurm.client("scontrol", "requeue", job)
    hold.unlink()
    state = slurm.run_requeued(job, JOB_TIMEOUT)
    out = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{out[-4000:]}"
    print(f"requeue to completion: {time.monotonic() - started:.0f} s")
    assert f"tune: resuming study 'hvdtrain' in {study}" in out, out[-4000:]
    params, value, rows = best(study)
    stopped = [r for r in rows if str(r.get("error", "")).startswith("interrupted")]
    assert [r["number"] for r in stopped] == [1], rows
    retry = [r for r in rows if r.get("retry_of") == 1]
    assert len(retry) == 1 and retry[0]["params"] == stopped[0]["params"], rows
    assert [r["state"] for r in rows if r not in stopped] == ["COMPLETE"] * 3, rows
    ref_params, ref_value, ref_rows = best(uninterrupted[0])
    assert (params, value) == (ref_params, ref_value), (rows, ref_rows)
    # Every trial, not only the best: the same parameters in the same order, the same values.
    assert [(r["params"], r["value"]) for r in rows if r not in stopped] == \
        [(r["params"], r["value"]) for r in ref_rows], (rows, ref_rows)
