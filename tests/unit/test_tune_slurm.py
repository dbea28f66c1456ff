"""`hvdtrain tune --launcher srun` without Slurm: the study folder a requeue finds, the trial's job step, the
options srun cannot honour, and a resumed study proposing what the uninterrupted one would have."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.errors import ConfigError
from hvdtrain.tuning.job_runner import error_line, job_command, job_env
from hvdtrain.tuning.space import parse_space
from hvdtrain.tuning.srun_trials import in_allocation, srun_command, step_env
from hvdtrain.tuning.study import open_study
from hvdtrain.tuning.tune_settings import TuneSettings

SPACE = parse_space({"lr": {"type": "float", "low": 0.001, "high": 0.5, "log": True},
                     "batch_size": {"type": "categorical", "choices": [16, 32, 64]}})


def test_the_study_folder_is_named_by_the_job_and_kept_by_a_requeue():
    settings = TuneSettings(trials=3, dir="studies", launcher="srun")
    first = in_allocation(settings, {"SLURM_JOB_ID": "42"})
    requeued = in_allocation(settings, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"})
    assert first.dir == requeued.dir == "studies/slurm-42"
    assert in_allocation(first, {"SLURM_JOB_ID": "42"}).dir == "studies/slurm-42"          # not nested twice
    assert in_allocation(settings, {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40",
                                    "SLURM_ARRAY_TASK_ID": "3"}).dir == "studies/slurm-40_3"


@pytest.mark.parametrize("options, env, words", [
    ({}, {}, "inside one"),
    ({"parallel": 2}, {"SLURM_JOB_ID": "7"}, "--parallel 2"),
    ({"hosts": "a:2,b:2"}, {"SLURM_JOB_ID": "7"}, "--hosts 'a:2,b:2'"),
    ({"mode": "inprocess"}, {"SLURM_JOB_ID": "7"}, "--mode job"),
])
def test_what_srun_cannot_honour_is_one_line_naming_it(options, env, words):
    with pytest.raises(ConfigError, match="--launcher srun") as err:
        in_allocation(TuneSettings(trials=2, launcher="srun", **options), env)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_trial_is_a_job_step_with_every_worker_started_by_srun():
    config = Path("/s/trials/trial-0003.yaml")
    gloo = job_command(config, TuneSettings(trials=2, np=4, launcher="srun"))
    assert gloo == ["srun", "--ntasks=4", "--mpi=none", "--kill-on-bad-exit=1", "--job-name=trial-0003",
                    sys.executable, "-m", "hvdtrain", "--config", str(config)]
    assert srun_command(config, TuneSettings(trials=2, backend="mpi"))[2] == "--mpi=pmix"
    # Gloo: horovodrun through launcher/grace.py, so the workers get --grace-s after SIGTERM; MPI: mpirun's rules
    assert job_command(config, TuneSettings(trials=2))[:3] == [sys.executable, "-m", "hvdtrain.launcher.grace"]
    assert job_env(TuneSettings(trials=2, grace_s=30.5)) == {"HVDTRAIN_GRACE_S": "30"}
    # ...read only by launcher/grace.py: not set where nothing reads it (mpirun's or srun's own rules apply)
    assert job_env(TuneSettings(trials=2, grace_s=30, backend="mpi")) == {}
    assert job_env(TuneSettings(trials=2, grace_s=30, launcher="srun")) == {}
    assert job_command(config, TuneSettings(trials=2, backend="mpi"))[0].endswith("horovodrun")


def test_srun_gets_the_jobs_cpus_per_task_unless_already_set():
    assert step_env({"SLURM_CPUS_PER_TASK": "4"}) == {"SRUN_CPUS_PER_TASK": "4"}
    assert step_env({"SLURM_CPUS_PER_TASK": "4", "SRUN_CPUS_PER_TASK": "2"}) == {}
    assert step_env({}) == {}


def test_srun_outside_slurm_is_refused_by_the_cli_in_one_line(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "tune", "--space", str(tmp_path / "space.yaml"),
                           "--trials", "2", "--launcher", "srun", "--dir", str(tmp_path / "t")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "--launcher srun runs each trial as a job step" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_study_stopped_mid_trial_and_resumed_proposes_what_the_uninterrupted_one_did(tmp_path, sampler):
    def value(params):
        return params["lr"] * params["batch_size"]

    reference = open_study(TuneSettings(trials=6, dir=str(tmp_path / "ref"), sampler=sampler, seed=5))
    for _ in range(6):
        trial = reference.ask(SPACE, {})
        reference.optuna.tell(trial, value(trial.params))
    expected = [t.params for t in reference.optuna.trials]
    reference.close()

    settings = TuneSettings(trials=6, dir=str(tmp_path / "stopped"), sampler=sampler, seed=5)
    first = open_study(settings)
    for _ in range(3):
        trial = first.ask(SPACE, {})
        first.optuna.tell(trial, value(trial.params))
    first.ask(SPACE, {})          # left RUNNING: the process is pre-empted here
    first.close()
    resumed = open_study(settings)
    assert resumed.recovered == [3]
    while resumed.remaining():
        trial = resumed.ask(SPACE, {})
        resumed.optuna.tell(trial, value(trial.params))
    rows = resumed.optuna.trials
    assert rows[3].state.name == "FAIL" and rows[4].user_attrs["retry_of"] == 3
    assert [t.params for t in rows if t.number != 3] == expected
    resumed.close()


def test_a_trial_log_tells_a_stop_with_a_checkpoint_from_a_crash(tmp_path):
    """What _finish reads to queue a trial stopped by a signal again (exit 143 alone is also srun's answer when
    --kill-on-bad-exit TERMs the workers of a crashed step)."""
    stopped, crashed = tmp_path / "stopped.log", tmp_path / "crashed.log"
    stopped.write_text("hvdtrain: 2 worker(s) (MPI, cpu)\nhvdtrain: stopped by SIGTERM at step 12; checkpoint c.pt\n"
                       "srun: error: hvdtnode: tasks 0-1: Exited with exit code 143\n")
    crashed.write_text("hvdtrain: error: the step's first node 'n1' does not resolve here\n"
                       "hvdtrain: stopped by SIGTERM at step 3\nsrun: error: tasks 0-1: Exited with exit code 143\n")
    assert error_line(stopped).startswith("hvdtrain: stopped by SIGTERM at step 12")
    assert error_line(crashed).startswith("hvdtrain: error: the step's first node")
