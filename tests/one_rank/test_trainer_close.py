"""Trainer.close() and `with Trainer(...)` give the run folder back (issue 38): the lock is the run directory
component's, released when the Trainer closes, not when it is garbage-collected."""
from __future__ import annotations

import pytest

from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.output.claim import LOCK
from hvdtrain.train.trainer import Trainer

MLP = ["--model", "mlp", "--hidden", "8", "--dataset", "synthetic", "--synthetic-samples", "64",
       "--synthetic-shape", "1,4,4", "--epochs", "1", "--threads", "1", "--progress-bar", "off"]


def trainer(tmp_path, name: str) -> Trainer:
    config = load_config(None, [*MLP, "--run-dir", str(tmp_path), "--name", name])
    data = build_data(config)
    return Trainer(build_model(config, (1, 4, 4), data.num_classes), data.train, data.val, config=config)


def test_the_run_folder_is_held_until_the_trainer_closes(tmp_path, one_worker):
    first = trainer(tmp_path, "same")
    assert (tmp_path / "same" / LOCK).exists()
    with pytest.raises(UserError, match=r"in use by another run .*close\(\) the earlier Trainer"):
        trainer(tmp_path, "same")      # this process's first run still holds it
    first.close()
    first.close()                      # twice: harmless
    assert not (tmp_path / "same" / LOCK).exists() and (tmp_path / "same" / "config.yaml").exists()
    with trainer(tmp_path, "other") as again:
        history = again.fit()
        assert (tmp_path / "other" / LOCK).exists() and len(history) == 1
    assert not (tmp_path / "other" / LOCK).exists() and (tmp_path / "other" / "summary.json").exists()
