"""The tracking component on its own: which tracker, metric names, rank 0 only, and an unreachable
server that costs one warning and no wait. (Issue 27.)"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.tracking import start
from hvdtrain.tracking.context import embedded_store, metrics, resolve
from hvdtrain.tracking.mlflow_sink import QUICK_HTTP


def test_auto_is_mlflow_only_when_a_server_is_named():
    assert resolve("auto", {"MLFLOW_TRACKING_URI": "http://x:5000"}) == "mlflow"
    assert resolve("auto", {}) == "none" and resolve("none", {"MLFLOW_TRACKING_URI": "http://x"}) == "none"
    assert embedded_store(Path("/r/runs/a")) == "sqlite:////r/runs/mlflow.db"


def test_records_become_metrics_named_by_kind_at_their_step():
    assert metrics({"kind": "epoch", "epoch": 1, "step": 32, "time": 1.0, "val_acc": 0.5, "stopped": True,
                    "rank_steps": [3, 3], "best": None}) == (32, {"epoch/val_acc": 0.5})


def test_only_rank_zero_tracks(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")   # restored after the test: later tests (any order) see rank 0
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    assert start(tmp_path, TrainConfig(tracking="mlflow"), say=print, warn=pytest.fail) is None
    assert start(tmp_path, TrainConfig(tracking="none"), say=print, warn=pytest.fail) is None


def test_an_unreachable_server_is_one_warning_and_finish_does_not_hang(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    # The sink's thread sets MLflow's quick-retry defaults in this process, possibly after finish() has given up
    # waiting: set here to the same values, they are undone after the test whenever that happens.
    for name, value in QUICK_HTTP.items():
        monkeypatch.setenv(name, value)
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


def test_gpu_metrics_are_numbered_as_the_process_sees_its_gpus():
    """NVML numbers a host's GPUs in PCI order; with CUDA_VISIBLE_DEVICES=2,0 a worker calls them cuda:0, cuda:1."""
    from hvdtrain.tracking.system import visible_gpus

    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,0"}, 3, uuids.__getitem__) == [(0, 2), (1, 0)]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bb"}, 3, uuids.__getitem__) == [(0, 1)]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,7,0"}, 3, uuids.__getitem__) == [(0, 1)]  # CUDA stops at 7
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 3, uuids.__getitem__) == []
    assert visible_gpus({}, 2, uuids.__getitem__) == [(0, 0), (1, 1)]


def test_system_sampling_without_a_driver_still_reads_cpu_and_memory():
    """pynvml is installed (the tracking extra) but this machine has no NVIDIA driver: NVML is unavailable, once."""
    from hvdtrain.tracking.system import Nvml, sample

    nvml = Nvml({})
    values = sample(nvml)
    assert {"cpu_percent", "memory_percent", "memory_used_gb"} <= set(values)
    assert any(key.startswith("gpu") for key in values) == nvml.available
    nvml.close()


def test_the_server_named_on_the_console_holds_no_credential(tmp_path):
    """Issue 51: only user:password@ was stripped from the shown URI; a ?token= went to the console as it was."""
    from hvdtrain.tracking.mlflow_sink import MlflowSink

    for uri in ("https://alice:s3cret@mlflow:5000/x?token=abcdef123456", "https://mlflow:5000/?access_token=abc123xyz"):
        shown = MlflowSink(tmp_path, uri, "e", embedded=False).where
        assert "s3cret" not in shown and "abcdef123456" not in shown and "abc123xyz" not in shown, shown
        assert "mlflow:5000" in shown
