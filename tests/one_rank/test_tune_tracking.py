"""hvdtrain tune with --tracking mlflow: one parent run per study in the study's own store, one nested run per
trial (the trial's training run) with its params, verdict and value. Real MLflow, real horovodrun jobs of
one worker each, or the trials one after another inside one process (--mode inprocess). (Issue 27.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.paths import ROOT
from support.processes import show

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


# The default run: 2 trials per mode (one launch each); 4 job trials (a pruned one more likely) are the long tier.
@pytest.mark.parametrize("mode,trials", [("job", 2), ("inprocess", 2), pytest.param("job", 4, marks=pytest.mark.long)])
def test_a_study_is_one_parent_run_with_a_nested_run_per_trial(tmp_path, mode, trials):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.02, high: 0.2, log: true}\n"
                                         "batch_size: {type: categorical, choices: [16, 32]}\n")
    study = tmp_path / "study"
    command = [sys.executable, "-m", "hvdtrain", "tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(study),
               "--trials", str(trials), "--epochs", "2", "--pruner-startup", "1", "--study", "digits-lr",
               "--model", "mlp", "--threads", "1", "--tensorboard", "false", "--tracking", "mlflow", "--mode", mode,
               *(["--np", "1"] if mode == "job" else [])]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400,
                          env=dict(env, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)
    rows = {row["number"]: row for row in json.loads((study / "trials.json").read_text())}
    assert not (study / "trials" / "mlflow.db").exists()       # the trials logged into the study's store

    client = MlflowClient(f"sqlite:///{study / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.run_name == "digits-lr", [r.info.run_name for r in runs]
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.params["trials"] == str(trials)
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(nested) == trials and len(runs) == trials + 1
    for run in nested:
        row = rows[int(run.data.tags["tune.trial"])]
        assert run.info.run_name == f"trial-{row['number']:04d}"
        assert run.data.tags["tune.state"] == row["state"] in ("COMPLETE", "PRUNED")
        assert float(run.data.params["lr"]) == pytest.approx(row["params"]["lr"])
        assert int(run.data.params["batch_size"]) == row["params"]["batch_size"]
        if row["state"] == "COMPLETE":
            assert run.data.metrics["tune/val_acc"] == pytest.approx(row["value"])
        else:
            assert run.data.tags["tune.pruned_at_epoch"] == str(row["pruned_at_epoch"])
        assert "epoch/val_acc" in run.data.metrics                 # the training run itself
    best = max((r for r in rows.values() if r["state"] == "COMPLETE"), key=lambda r: r["value"])
    assert parent.data.metrics["tune/best_val_acc"] == pytest.approx(best["value"])
    assert parent.data.tags["tune.best_trial"] == str(best["number"])
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"trials.json", "best.yaml"}
