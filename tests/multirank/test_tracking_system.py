"""System metrics in the MLflow run: rank 0 (its host's local rank 0) samples CPU and memory in a background
thread into the same run, named by host; rank 1 on the same host samples nothing. (Issue 27.)"""
from __future__ import annotations

import os
import time

import pytest
from support.processes import horovodrun, show
from support.runs import EQUIV

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.tracking import system  # noqa: E402


def test_two_workers_on_one_host_log_that_hosts_system_metrics_into_the_one_run(tmp_path):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, "--max-steps", "0", "--epochs", "2", "--tensorboard", "false",
                          "--run-dir", str(tmp_path), "--name", "sys", "--tracking", "mlflow"], "gloo",
                      env={system.INTERVAL_ENV: "0.1"})
    assert proc.returncode == 0, show(proc)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    host = system.host_name()
    names = {name for name in run.data.metrics if name.startswith("system/")}
    assert {f"system/{host}/{key}" for key in ("cpu_percent", "memory_percent", "memory_used_gb")} <= names, names
    assert all(name.startswith(f"system/{host}/") for name in names)          # one host, one sampler
    history = client.get_metric_history(run.info.run_id, f"system/{host}/memory_percent")
    steps = sorted(m.step for m in history)
    assert steps == list(range(len(steps))) and all(0 < m.value <= 100 for m in history)


def test_a_sampler_without_a_tracker_keeps_its_samples_for_the_trainer_to_gather():
    sampler = system.SystemSampler(0.05, host="node-b")
    try:
        deadline = time.monotonic() + 10
        while not sampler.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        taken = sampler.drain()
    finally:
        sampler.stop()
    assert taken and {name for name, *_ in taken} >= {"system/node-b/cpu_percent", "system/node-b/memory_percent"}
    assert all(step >= 0 and stamp > 0 for _, _, step, stamp in taken)
    assert system.start(env={system.INTERVAL_ENV: "0"}) is None
