"""Tier 2: one real Horovod worker, in this process."""
from __future__ import annotations

import itertools
import json

import pytest
import torch
import yaml
from support.paths import ROOT
from support.runs import records

from hvdtrain.config.train_config import load_config
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.config_fit import fit


def test_in_process_run_writes_a_complete_run_directory(tmp_path, one_worker):
    config = load_config(None, ["--run-dir", str(tmp_path), "--name", "solo"])
    summary = fit(config).summary
    run = tmp_path / "solo"
    assert summary["workers"] == 1 and summary["val_acc"] >= 0.95, summary
    assert yaml.safe_load((run / "config.yaml").read_text()) == config.to_dict()
    kinds = [r["kind"] for r in records(run)]
    assert kinds.count("epoch") == 10 and kinds[-1] == "summary"
    # 1,438 training samples at batch 32 -> 45 steps/epoch; a train record every 20 steps.
    assert kinds.count("train") == (10 * 45) // 20
    state = torch.load(run / "model.pt", weights_only=True)
    model = build_model(config, (1, 8, 8), 10)
    assert state.keys() == model.state_dict().keys()
    assert json.loads((run / "summary.json").read_text())["steps"] == 10 * 45


def test_plugins_by_import_path_train_end_to_end(tmp_path, monkeypatch, one_worker):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    config = load_config(None, ["--model", "my_plugins:build_model", "--dataset", "my_plugins:build_dataset",
                                "--epochs", "30", "--lr", "0.1", "--batch-size", "16",
                                "--run-dir", str(tmp_path), "--name", "spirals"])
    summary = fit(config).summary
    assert summary["val_samples"] == 120 and summary["val_acc"] >= 0.9, summary


def test_an_existing_run_is_never_overwritten(tmp_path, one_worker):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("{}\n")
    config = load_config(None, ["--epochs", "1", "--run-dir", str(tmp_path), "--name", "taken"])
    with pytest.raises(UserError, match="already holds a run; pass a new --name"):
        fit(config)
    assert (tmp_path / "taken" / "metrics.jsonl").read_text() == "{}\n"


def test_one_worker_warmup_is_flat_then_cosine_decays(tmp_path, one_worker):
    config = load_config(None, ["--epochs", "2", "--warmup-epochs", "1", "--lr-scaling", "linear",
                                "--run-dir", str(tmp_path), "--name", "warm", "--log-interval", "1"])
    fit(config)
    lrs = [r["lr"] for r in records(tmp_path / "warm", "train")]
    # One worker: the scaled LR equals the base LR, so warmup is flat, then cosine decay to ~0.
    assert lrs[:44] == [0.05] * 44
    assert all(a >= b for a, b in itertools.pairwise(lrs)) and lrs[-1] < 0.001


def test_a_second_fit_reports_the_samples_of_its_own_epochs_per_second(tmp_path, one_worker):
    """samples/s of a fit() call is that call's samples over that call's wall time: it once divided the
    whole history's samples by the second call's time (2x here, ~11x after ten epochs)."""
    from hvdtrain.data.datasets import build_data
    from hvdtrain.train.trainer import Trainer

    config = load_config(None, ["--dataset", "synthetic", "--synthetic-samples", "320", "--synthetic-shape",
                                "1,4,4", "--model", "mlp", "--hidden", "8", "--batch-size", "32",
                                "--run-dir", "", "--threads", "1"])
    data = build_data(config)
    trainer = Trainer(build_model(config, (1, 4, 4), 10), data.train, data.val, config=config)
    for epochs in (1, 2):
        summary = trainer.fit(epochs).summary
        assert summary["epochs_run"] == len(trainer.history)
        samples = summary["samples_per_s"] * summary["wall_time_s"]
        assert samples == pytest.approx(epochs * len(data.train), rel=1e-9), (epochs, summary)
