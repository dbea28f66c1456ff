"""Slurm's requeue defaults (cluster/slurm_requeue.py), the stop signals (train/signals.py) and launch's grace option,
without Slurm or Horovod."""
from __future__ import annotations

import signal

import pytest

from hvdtrain.cli.launch import _own_options
from hvdtrain.cli.train import _config
from hvdtrain.cluster.slurm_requeue import requeue_defaults, run_name
from hvdtrain.errors import UserError
from hvdtrain.train.signals import StopRequest, agreed_signal, stop_flags


def test_a_slurm_job_names_its_run_by_the_job_and_resumes_once_requeued(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    config = _config(["--epochs", "1"])
    assert (config.name, config.resume) == ("slurm-4242", "")       # the first run: a fresh folder
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    config = _config(["--epochs", "1"])
    assert (config.name, config.resume) == ("slurm-4242", "auto")   # requeued: the same folder, resumed
    assert config.changed()["name"] == "slurm-4242"                  # the banner and config.yaml say so


def test_what_the_user_gives_wins_and_no_run_dir_means_no_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert _config(["--name", "mine"]).name == "mine" and _config(["--name", "mine"]).resume == "auto"
    yaml = tmp_path / "c.yaml"
    yaml.write_text("name: from-file\nresume: ''\n")
    config = _config(["--config", str(yaml)])
    assert (config.name, config.resume) == ("from-file", "")
    config = _config(["--run-dir", ""])
    assert (config.name, config.resume) == ("", "")


def test_outside_slurm_nothing_changes(monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    assert _config([]).name == "" and requeue_defaults({}, set()) == ({}, "")
    assert run_name({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "3"}) == "slurm-8_3"


def test_usr1_stops_like_term_and_repeated_scheduler_signals_do_not_abort(monkeypatch):
    stop = StopRequest()
    stop.handle(signal.SIGUSR1, None)
    stop.handle(signal.SIGTERM, None)       # slurmstepd's TERM and srun's forwarded one: still a clean stop
    stop.handle(signal.SIGTERM, None)
    assert stop.signum == signal.SIGTERM
    with pytest.raises(SystemExit) as exit_:
        stop.handle(signal.SIGINT, None)    # a second Ctrl-C: stop now
    assert exit_.value.code == 128 + signal.SIGINT
    summed = [a + b for a, b in zip(stop_flags(signal.SIGUSR1), stop_flags(0), strict=True)]
    assert agreed_signal(summed) == signal.SIGUSR1


def test_launch_grace_option(monkeypatch):
    monkeypatch.delenv("HVDTRAIN_GRACE_S", raising=False)
    _, grace, rest = _own_options(["--grace-s", "60", "--secrets-dir", "/tmp", "-np", "2", "python"])
    assert grace == "60" and rest == ["-np", "2", "python"]
    assert _own_options(["-np", "2"])[1] == ""
    monkeypatch.setenv("HVDTRAIN_GRACE_S", "45")
    assert _own_options(["-np", "2"])[1] == "45"
    with pytest.raises(UserError, match="whole number of seconds"):
        _own_options(["--grace-s", "0", "-np", "2"])
