"""kill -9, then --resume auto: the same MLflow run continues (its id kept in <run>/tracking.json), never a
second one. Real MLflow, the embedded sqlite store. (Issue 27.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.paths import PLUGINS_DIR, ROOT
from support.processes import kill_tree, show
from support.runs import EQUIV, records

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.tracking import system  # noqa: E402


def test_kill_9_then_resume_auto_continues_the_one_mlflow_run(tmp_path):
    run_dir = tmp_path / "runs" / "killed"
    command = [sys.executable, "-m", "hvdtrain", *EQUIV, "--max-steps", "0", "--epochs", "3", "--tensorboard",
               "false", "--model", "stall_probe:stalling_mlp", "--checkpoint-steps", "8",
               "--run-dir", str(tmp_path / "runs"), "--name", "killed", "--tracking", "mlflow"]
    env = dict(os.environ, PYTHONPATH=str(PLUGINS_DIR), HVDTRAIN_STALL_AFTER="13", PYTHONUNBUFFERED="1",
               **{system.INTERVAL_ENV: "0.2"})
    env.pop("MLFLOW_TRACKING_URI", None)
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Killed once MLflow holds step 12, logged after the last checkpoint (8); the model stalls at step 14,
        # before the next one (16), so the resumed process redoes steps the run already has.
        deadline = time.monotonic() + 120
        while not ((run_dir / "tracking.json").exists() and 12 in {
                m.step for m in client.get_metric_history(
                    json.loads((run_dir / "tracking.json").read_text())["run_id"], "train/loss")}):
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.1)
    finally:
        kill_tree(first, 9)
        log.close()
    run_id = json.loads((run_dir / "tracking.json").read_text())["run_id"]
    del env["HVDTRAIN_STALL_AFTER"]
    second = subprocess.run([*command, "--resume", "auto"], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, show(second)
    assert "warning" not in second.stdout + second.stderr, show(second)
    assert f"continuing MLflow run {run_id}" in second.stdout, show(second)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    summary = json.loads((run_dir / "summary.json").read_text())
    history = client.get_metric_history(run_id, "train/loss")
    steps = sorted(m.step for m in history)
    # Each logged step once: the steps redone after the last checkpoint are not logged a second time.
    assert steps == list(range(4, summary["steps"] + 1, 4)), steps
    logged = records(run_dir, "train")
    redone = {r["step"] for r in logged}
    assert len(logged) > len(redone)  # the kill did leave redone steps
    epochs = sorted(m.step for m in client.get_metric_history(run_id, "epoch/val_acc"))
    assert len(epochs) == len(set(epochs)) == 3, epochs
    # The second process's samples follow the first one's: one sample per step, none written over.
    samples = sorted(m.step for m in client.get_metric_history(run_id, f"system/{system.host_name()}/cpu_percent"))
    assert samples == list(range(len(samples))), samples
