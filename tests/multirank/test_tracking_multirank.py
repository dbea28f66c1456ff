"""--tracking mlflow under horovodrun (Gloo and MPI): one MLflow run per job, from rank 0 alone, holding
the config, every record of metrics.jsonl at its step and the run folder's files. Real MLflow (the
embedded sqlite store), no mocks. (Issue 27.)

One job per backend serves every test here: the folder's records in the run and, on the Gloo job, the system
metrics of the host's local rank 0 (sampled every 0.1 s there) in the same run."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from support.processes import horovodrun, show
from support.runs import EQUIV, records

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.config.train_config import TrainConfig  # noqa: E402
from hvdtrain.tracking import system  # noqa: E402

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


class TrackedJob(NamedTuple):
    backend: str
    folder: Path                  # --run-dir: mlflow.db, mlartifacts/ and the run folder "tracked"
    proc: subprocess.CompletedProcess


@pytest.fixture(scope="module", params=["gloo", "mpi"])
def tracked_job(request, tmp_path_factory) -> TrackedJob:
    """2 workers of EQUIV (batch 16, one epoch) with --tracking mlflow into the embedded store beside the run
    folder, trained once per backend for the tests of this file; the Gloo job samples system metrics every 0.1 s
    (as test_tracking_system's own Gloo job did), the MPI job at the default interval, as before."""
    folder = tmp_path_factory.mktemp(f"tracked-{request.param}")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the embedded store beside the run folder
        proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, "--batch-size", "16", "--max-steps", "0", "--epochs", "1",
                              "--monitor", "val_acc", "--tensorboard", "false", "--run-dir", str(folder),
                              "--name", "tracked", "--tracking", "mlflow"], request.param,
                          env={system.INTERVAL_ENV: "0.1"} if request.param == "gloo" else None)
    return TrackedJob(request.param, folder, proc)


def test_two_workers_make_one_mlflow_run_with_the_folders_records(tracked_job):
    backend, folder, proc = tracked_job
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    run_id = assert_run_mirrors_folder(client, folder / "tracked", workers=2)
    assert client.get_run(run_id).data.tags["backend"] == {"gloo": "Gloo", "mpi": "MPI"}[backend]
    # the embedded store keeps artifacts beside mlflow.db, not in the folder training started from
    assert (folder / "mlartifacts").is_dir()


@pytest.mark.parametrize("tracked_job", ["gloo"], indirect=True)
def test_two_workers_on_one_host_log_that_hosts_system_metrics_into_the_one_run(tracked_job):
    """(Moved from test_tracking_system.py: the same job as above serves it.) Rank 0, its host's local rank 0,
    samples CPU and memory in a background thread into the run, named by host; rank 1 samples nothing."""
    proc, folder = tracked_job.proc, tracked_job.folder
    assert proc.returncode == 0, show(proc)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    host = system.host_name()
    names = {name for name in run.data.metrics if name.startswith("system/")}
    assert {f"system/{host}/{key}" for key in ("cpu_percent", "memory_percent", "memory_used_gb")} <= names, names
    assert all(name.startswith(f"system/{host}/") for name in names)          # one host, one sampler
    history = client.get_metric_history(run.info.run_id, f"system/{host}/memory_percent")
    steps = sorted(m.step for m in history)
    assert steps == list(range(len(steps))) and all(0 < m.value <= 100 for m in history)
