"""Tier 1: what --resume refuses or applies when the config changed since the checkpoint (issue 33)."""
from __future__ import annotations

import pytest

from hvdtrain.checkpoint.resume import config_conflict, restore_hyperparameters

SAVED = {"dataset": "digits", "seed": 42, "val_fraction": 0.2, "monitor": "", "batch_size": 32, "accumulate": 1,
         "lr": 0.01, "momentum": 0.9, "epochs": 3, "name": "run"}


@pytest.mark.parametrize("key, value", [("seed", 7), ("val_fraction", 0.3), ("dataset", "synthetic"),
                                        ("monitor", "val_acc")])
def test_a_changed_data_defining_key_is_refused_in_one_line_naming_key_and_way_out(key, value):
    error = config_conflict(SAVED, {**SAVED, key: value}, mid_epoch=False)
    flag = "--" + key.replace("_", "-")
    assert error is not None and "\n" not in error
    assert f"{flag} {SAVED[key]!r}" in error or f"{flag} {SAVED[key]}" in error
    assert "new run" in error


def test_batch_layout_matters_only_mid_epoch():
    changed = {**SAVED, "batch_size": 64}
    assert config_conflict(SAVED, changed, mid_epoch=False) is None
    error = config_conflict(SAVED, changed, mid_epoch=True)
    assert error is not None and "--batch-size 32" in error


def test_training_length_lr_and_an_old_checkpoint_without_a_config_are_accepted():
    assert config_conflict(SAVED, {**SAVED, "epochs": 9, "lr": 0.1, "momentum": 0.5, "name": "x"},
                           mid_epoch=True) is None
    assert config_conflict({}, SAVED, mid_epoch=True) is None


def test_optimizer_hyperparameters_set_now_replace_the_restored_ones_and_are_named():
    restored = [{"params": [0], "lr": 0.001, "momentum": 0.9, "weight_decay": 0.0, "betas": (0.9, 0.99)}]
    wanted = [{"lr": 0.02, "momentum": 0.5, "weight_decay": 0.0, "betas": (0.8, 0.99)}]
    line = restore_hyperparameters(restored, wanted)
    assert restored == [{"params": [0], "lr": 0.001, "momentum": 0.5, "weight_decay": 0.0, "betas": (0.8, 0.99)}]
    assert line is not None and "momentum 0.9 -> 0.5" in line and "betas (0.9, 0.99) -> (0.8, 0.99)" in line
    assert "weight_decay" not in line and "lr" not in line  # the LR is scheduled from this run's own anyway
    assert restore_hyperparameters(restored, wanted) is None
    assert restore_hyperparameters(restored, wanted, ["lr 0.01 -> 0.02"]) == \
        "optimizer settings changed since the checkpoint, applied: lr 0.01 -> 0.02"
