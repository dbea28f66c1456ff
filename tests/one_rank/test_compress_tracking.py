"""hvdtrain compress with tracking on: the report's figures and the exported model folder as one MLflow run in
the store of the run it compressed, linked to that run. Real MLflow, the embedded sqlite store. (Issue 27.)"""
from __future__ import annotations

import json

import pytest

import hvdtrain

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def test_int8_of_a_tracked_run_is_one_mlflow_run_with_the_reports_figures_and_the_export(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # One epoch and one timed pass per latency: the claim is that the run holds the report's figures, whatever they are.
    hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=1, threads=1, run_dir=str(tmp_path), name="mlp",
                                      tensorboard=False, tracking="mlflow"))
    report = hvdtrain.compress(tmp_path / "mlp", "int8", repeats=1, verbose=False)   # tracking: as the source
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    assert set(runs) == {"mlp", "mlp-int8"}
    run = runs["mlp-int8"]
    assert run.info.status == "FINISHED" and run.data.tags["hvdtrain.kind"] == "compress"
    assert run.data.tags["hvdtrain.source_run_id"] == runs["mlp"].info.run_id
    assert run.data.params["method"] == "int8" and run.data.params["options.int8_mode"] == "auto"
    original, int8 = report["models"]
    assert int8["name"] == "int8 (dynamic)"
    for key, row in (("original", original), ("int8_dynamic", int8)):
        assert run.data.metrics[f"{key}/bytes"] == row["bytes"]
        assert run.data.metrics[f"{key}/val_acc"] == pytest.approx(row["val_acc"])
        assert run.data.metrics[f"{key}/latency_ms_batch64"] == pytest.approx(row["latency_ms"]["64"])
    assert run.data.metrics["ratio/bytes"] == pytest.approx(report["ratios"]["bytes"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.pt2", "compressed.pt", "config.yaml", "report.json"} <= artifacts
    assert json.loads((tmp_path / "mlp-int8" / "tracking.json").read_text())["run_id"] == run.info.run_id

    hvdtrain.compress(tmp_path / "mlp", "int8", out=str(tmp_path / "untracked"), repeats=1, verbose=False,
                      tracking="none")
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == 2
