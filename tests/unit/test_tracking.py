"""The tracking component on its own: which tracker, metric names, rank 0 only, and an unreachable
server that costs one warning and no wait. (Issue 27.)"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.tracking import start
from hvdtrain.tracking.context import embedded_store, metrics, resolve


def test_auto_is_mlflow_only_when_a_server_is_named():
    assert resolve("auto", {"MLFLOW_TRACKING_URI": "http://x:5000"}) == "mlflow"
    assert resolve("auto", {}) == "none" and resolve("none", {"MLFLOW_TRACKING_URI": "http://x"}) == "none"
    assert embedded_store(Path("/r/runs/a")) == "sqlite:////r/runs/mlflow.db"


def test_records_become_metrics_named_by_kind_at_their_step():
    assert metrics({"kind": "epoch", "epoch": 1, "step": 32, "time": 1.0, "val_acc": 0.5, "stopped": True,
                    "rank_steps": [3, 3], "best": None}) == (32, {"epoch/val_acc": 0.5})


def test_only_rank_zero_tracks(tmp_path):
    os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"] = "1", "2"
    assert start(tmp_path, TrainConfig(tracking="mlflow"), say=print, warn=pytest.fail) is None
    assert start(tmp_path, TrainConfig(tracking="none"), say=print, warn=pytest.fail) is None


def test_an_unreachable_server_is_one_warning_and_finish_does_not_hang(tmp_path):
    pytest.importorskip("mlflow")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    warnings: list[str] = []
    tracker = start(tmp_path, TrainConfig(), say=print, warn=warnings.append,
                    env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert tracker is not None
    began = time.monotonic()
    for step in range(50):
        tracker.record({"kind": "train", "epoch": 0, "step": step, "loss": 1.0})
    assert time.monotonic() - began < 1.0  # the training thread never waited on the tracker
    tracker.finish(tmp_path, wait_s=30)
    tracker.record({"kind": "train", "epoch": 0, "step": 99, "loss": 1.0})
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0], warnings
    assert not (tmp_path / "tracking.json").exists()
