"""--tracking mlflow under horovodrun (Gloo and MPI): one MLflow run per job, from rank 0 alone, holding
the config, every record of metrics.jsonl at its step and the run folder's files. Real MLflow (the
embedded sqlite store), no mocks. (Issue 27.)"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.processes import BACKENDS, horovodrun, show
from support.runs import EQUIV, records

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.config.train_config import TrainConfig  # noqa: E402

EXPECTED_FILES = {"config.yaml", "summary.json", "metrics.jsonl", "curves.png", "model.safetensors",
                  "best.safetensors"}


def tracked_values(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


def jsonl_values(written: list[dict], kind: str, key: str) -> list[tuple[int, float]]:
    return sorted((r["step"], float(r[key])) for r in written if r["kind"] == kind)


def assert_run_mirrors_folder(client: MlflowClient, run_dir: Path, workers: int) -> str:
    """The store's one run matches the run folder; returns its id."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    assert len(runs) == 1, [r.info.run_name for r in runs]
    run = runs[0]
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    assert json.loads((run_dir / "tracking.json").read_text())["run_id"] == run.info.run_id
    params = run.data.params
    assert set(TrainConfig().to_dict()) <= set(params)
    assert params["tracking"] == "mlflow" and params["batch_size"] == "16"
    tags = run.data.tags
    assert tags["workers"] == str(workers) and tags["device"] == "cpu" and tags["hvdtrain.version"]
    written = records(run_dir)
    train = [r for r in written if r["kind"] == "train"]
    assert train
    for key in ("loss", "acc", "lr"):
        assert tracked_values(client, run.info.run_id, f"train/{key}") == jsonl_values(written, "train", key), key
    for key in ("val_loss", "val_acc", "train_loss"):
        assert tracked_values(client, run.info.run_id, f"epoch/{key}") == jsonl_values(written, "epoch", key), key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert EXPECTED_FILES <= artifacts, artifacts
    return run.info.run_id


@BACKENDS
def test_two_workers_make_one_mlflow_run_with_the_folders_records(tmp_path, backend):
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the embedded store beside the run folder
    proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, "--batch-size", "16", "--max-steps", "0", "--epochs", "1",
                          "--monitor", "val_acc", "--tensorboard", "false", "--run-dir", str(tmp_path),
                          "--name", "tracked", "--tracking", "mlflow"], backend)
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = assert_run_mirrors_folder(client, tmp_path / "tracked", workers=2)
    assert client.get_run(run_id).data.tags["backend"] == {"gloo": "Gloo", "mpi": "MPI"}[backend]
    # the embedded store keeps artifacts beside mlflow.db, not in the folder training started from
    assert (tmp_path / "mlartifacts").is_dir()
