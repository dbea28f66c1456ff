"""The Python API: Trainer, fit and launch, as a notebook uses them (real workers, real Horovod)."""
from __future__ import annotations

import secrets
import threading
import time

import pytest
import torch
from support.worker_fns import _raise_on_rank_1, _secret_seen_and_leaks
from torch.utils.data import TensorDataset

import hvdtrain
from hvdtrain.errors import LaunchError, WorkerError


def _rank_and_sum(x):
    import torch

    from hvdtrain.distributed import collectives, runtime

    world = runtime.init()
    return world.rank, world.size, x, collectives.allreduce_sum(torch.tensor([world.rank + 1.0]), name="api_sum").item()


def _fit_mlp(epochs):
    import hvdtrain

    return hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=epochs, run_dir=""))


def test_launch_returns_results_from_both_ranks():
    results = hvdtrain.launch(_rank_and_sum, "payload", np=2, all_ranks=True)
    assert results == [(0, 2, "payload", 3.0), (1, 2, "payload", 3.0)]
    assert hvdtrain.launch(_rank_and_sum, "again", np=2) == (0, 2, "again", 3.0)  # launch twice


def test_launch_passes_credentials_inside_the_job_not_on_command_lines(monkeypatch):
    """horovodrun (Gloo) starts local workers as `sh -c 'env NAME=value ... python'`: hvdtrain.launch keeps
    credential-like variables out of that and sends them inside the pickled job."""
    value = f"hvdt-{secrets.token_hex(16)}"
    monkeypatch.setenv("HVDTRAIN_TEST_SECRET_TOKEN", value)
    results = hvdtrain.launch(_secret_seen_and_leaks, "HVDTRAIN_TEST_SECRET_TOKEN", np=2, all_ranks=True,
                              env={"MY_API_KEY": "also-secret"})
    assert results == [(value, []), (value, [])]


def test_a_worker_exception_names_its_rank_and_traceback_within_60_s():
    start = time.monotonic()
    with pytest.raises(WorkerError) as err:
        hvdtrain.launch(_raise_on_rank_1, np=2)
    assert time.monotonic() - start < 60
    assert err.value.rank == 1
    assert str(err.value).startswith("rank 1 raised ValueError: planted failure on rank 1")
    assert "_raise_on_rank_1" in err.value.remote_traceback


def test_a_non_picklable_argument_fails_before_any_worker_starts():
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"argument 0 \(lock\) cannot be sent to the workers"):
        hvdtrain.launch(_rank_and_sum, threading.Lock(), np=2)
    assert time.monotonic() - start < 5  # starting workers takes several seconds


def test_fit_launch_fit_in_one_process():
    first = hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=2, run_dir=""))
    launched = hvdtrain.launch(hvdtrain.load_config(model="mlp", epochs=10, run_dir=""), np=2)
    # A threshold: that a launched job trains is the claim (launch == Spark and Ray workers is exact, tests/cluster).
    assert launched.summary["workers"] == 2 and launched[-1]["val_acc"] >= 0.95
    assert launched.summary["param_digests"][0] == launched.summary["param_digests"][1]
    second = _fit_mlp(2)
    assert [r["val_acc"] for r in second] == [r["val_acc"] for r in first]  # same seed, same result


def test_trainer_with_a_user_model_regression_loss_and_predict():
    torch.manual_seed(0)
    inputs = torch.randn(300, 3)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5]])
    train, val = TensorDataset(inputs[:240], targets[:240]), TensorDataset(inputs[240:], targets[240:])
    model = torch.nn.Linear(3, 1)
    config = hvdtrain.load_config(epochs=20, lr=0.05, batch_size=16, run_dir="", warmup_epochs=0)
    trainer = hvdtrain.Trainer(model, train, val, loss_fn=torch.nn.functional.mse_loss, config=config)
    history = trainer.fit()
    # Real-valued targets: MSE and MAE, not accuracy.
    assert history[-1]["val_loss"] < 1e-3 and "val_acc" not in history[-1]
    assert history[-1]["val_mse"] == pytest.approx(history[-1]["val_loss"], rel=1e-6) and history[-1]["val_mae"] < 0.05
    metrics = trainer.evaluate()
    assert metrics["val_samples"] == 60
    predictions = trainer.predict(val)
    torch.testing.assert_close(predictions, model(inputs[240:]).detach(), atol=1e-6, rtol=0)
    more = trainer.fit(epochs=2)  # fit again continues the same run
    assert len(more) == 22 and more is history


def test_history_plot_writes_a_png(tmp_path):
    history = hvdtrain.History([{"epoch": 0, "train_loss": 1.0, "val_loss": 1.2, "train_acc": 0.5, "val_acc": 0.4},
                                {"epoch": 1, "train_loss": 0.5, "val_loss": 0.7, "train_acc": 0.8, "val_acc": 0.7}])
    history.plot(tmp_path / "curves.png")
    data = (tmp_path / "curves.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert "val_acc" in history.table().splitlines()[0]
