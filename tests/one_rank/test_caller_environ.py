"""An in-process run (hvdtrain.fit, a Trainer in a notebook) gives the caller's os.environ back as it found it:
the variables it set for Horovod's start (HOROVOD_*, OMPI_MCA_*, CUDA_DEVICE_ORDER) and for data libraries
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) are removed or get their old value back when the run ends,
also when it fails. Horovod itself stays initialised (runtime.started says why)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.environ import LIBRARY_SET
from support.paths import ROOT
from support.processes import show

from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.config_fit import fit
from hvdtrain.train.trainer import Trainer

MLP = ["--model", "mlp", "--hidden", "8", "--dataset", "synthetic", "--synthetic-samples", "64",
       "--synthetic-shape", "1,4,4", "--epochs", "1", "--threads", "1", "--progress-bar", "off"]


def changed(before: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Variables whose value differs from `before`: name -> (before, now). Torch's own first-use variables
    (conftest.LIBRARY_SET) are not the run's."""
    names = (set(before) | set(os.environ)) - LIBRARY_SET - {"PYTEST_CURRENT_TEST"}
    return {name: (before.get(name), os.environ.get(name)) for name in sorted(names)
            if before.get(name) != os.environ.get(name)}


def trainer(tmp_path, name: str, *more: str, val: bool = True) -> Trainer:
    config = load_config(None, [*MLP, *more, "--run-dir", str(tmp_path), "--name", name])
    data = build_data(config)
    return Trainer(build_model(config, (1, 4, 4), data.num_classes), data.train, data.val if val else None,
                   config=config)


def test_fit_leaves_the_callers_environment_as_it_was(tmp_path):
    before = dict(os.environ)
    assert len(fit(load_config(None, [*MLP, "--run-dir", str(tmp_path), "--name", "fit"]))) == 1
    assert changed(before) == {}


def test_a_trainer_gives_the_environment_back_when_fit_returns(tmp_path, monkeypatch):
    """A notebook's `trainer.fit()` without close(): the variables are the run's while it trains, the caller's after."""
    monkeypatch.setenv("RANK", "7")       # a value of the caller's own: it comes back, not just a removal
    monkeypatch.setenv("HVDTRAIN_RANK_ENV_BY", "1:7,,,")   # marked as hvdtrain's export (a parent's): the run's own
    before = dict(os.environ)
    run = trainer(tmp_path, "fit-twice")
    assert changed(before) == {}
    during: list[dict[str, str]] = []

    def look(record: dict) -> bool:
        during.append(dict(os.environ))
        return False                                                     # no stop: train on
    run.fit(after_epoch=look)
    assert during[0]["RANK"] == "0" and during[0]["WORLD_SIZE"] == "1"   # for data libraries, while it trains
    assert changed(before) == {}
    run.fit(1)                                                           # a second fit: the same again
    assert changed(before) == {}
    run.close()


def test_a_trainer_that_fails_to_start_gives_the_environment_back(tmp_path):
    before = dict(os.environ)
    with pytest.raises(UserError, match="needs held-out data"):
        trainer(tmp_path, "refused", "--monitor", "val_acc", val=False)   # refused after Horovod's start
    assert changed(before) == {}


def test_a_tracked_fit_leaves_mlflows_variables_as_it_found_them(tmp_path, monkeypatch):
    """The tracker's MLflow sink sets MLflow's quick-retry settings for its requests, and gives them back."""
    pytest.importorskip("mlflow")
    from hvdtrain.tracking.mlflow_sink import QUICK_HTTP

    for name in [*QUICK_HTTP, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "MLFLOW_TRACKING_URI"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")              # the user's own: it stays as it is
    before = dict(os.environ)
    fit(load_config(None, [*MLP, "--tracking", "mlflow", "--tensorboard", "false", "--run-dir", str(tmp_path),
                           "--name", "tracked"]))
    assert (tmp_path / "tracked" / "tracking.json").exists()               # it did track
    assert changed(before) == {}


FIRST_START = """
import os, sys
from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model
from hvdtrain.train.config_fit import fit
from hvdtrain.train.trainer import Trainer
before = dict(os.environ)
config = load_config(None, sys.argv[1:])
fit(config)
fit(config)   # Horovod kept running: the same settings are not refused as too late
data = build_data(config)
during = []
with Trainer(build_model(config, (1, 4, 4), data.num_classes), data.train, data.val, config=config) as trainer:
    trainer.fit(after_epoch=lambda record: during.append(dict(os.environ)) and False)
print("DURING", {k: during[0].get(k) for k in ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS")})
ignored = {"TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
print("CHANGED", sorted(n for n in (set(before) | set(os.environ)) - ignored if before.get(n) != os.environ.get(n)))
"""


def test_the_first_start_of_horovod_gives_its_settings_back_too():
    """In a fresh process the first run also starts Horovod: what it set for hvd.init() (Open MPI's and Gloo's
    defaults, the config's stall check, CUDA's device order) goes too, and comes back for each later run (an
    elastic reset's hvd.init() reads it); a later run with the same Horovod settings is not refused."""
    ours = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_DEVICE_ORDER", "HVDTRAIN_RANK_ENV_BY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMIX_")) and k not in ours}
    proc = subprocess.run([sys.executable, "-c", FIRST_START, *MLP, "--stall-check-s", "5", "--run-dir", ""],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "DURING {'HOROVOD_STALL_CHECK_TIME_SECONDS': '5', 'HOROVOD_GLOO_TIMEOUT_SECONDS': '60'}" in proc.stdout, \
        show(proc)
    assert "CHANGED []" in proc.stdout, show(proc)


class FakeHorovod:
    """Starts once and records the environment hvd.init() read."""

    def __init__(self) -> None:
        self.read: list[dict[str, str]] = []

    def is_initialized(self) -> bool:
        return bool(self.read)

    def init(self) -> None:
        if not self.read:
            self.read.append(dict(os.environ))

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    local_rank, local_size = rank, size


def test_later_runs_are_compared_with_what_horovod_read_at_its_start(monkeypatch):
    from hvdtrain.distributed import runtime

    fake = FakeHorovod()
    monkeypatch.setattr(runtime, "hvd", fake)
    monkeypatch.setattr(runtime, "_READ_AT_START", {})
    monkeypatch.setattr(runtime, "_SET_FOR_START", {})
    monkeypatch.delenv("HOROVOD_AUTOTUNE", raising=False)
    before = dict(os.environ)
    with runtime.started({"HOROVOD_AUTOTUNE": "1"}):
        assert os.environ["HOROVOD_AUTOTUNE"] == "1"
    assert fake.read[0]["HOROVOD_AUTOTUNE"] == "1" and changed(before) == {}
    with runtime.started({"HOROVOD_AUTOTUNE": "1"}):      # the same settings: Horovod runs with them already
        assert os.environ["HOROVOD_AUTOTUNE"] == "1"      # set again for the run (an elastic reset reads them)
    with pytest.raises(UserError, match="HOROVOD_STALL_CHECK_DISABLE cannot take effect"), \
            runtime.started({"HOROVOD_STALL_CHECK_DISABLE": "1"}):
        pass
    assert changed(before) == {} and len(fake.read) == 1
