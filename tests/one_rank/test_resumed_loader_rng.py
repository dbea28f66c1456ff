"""Tier 2: after a mid-epoch resume, the training loader's generator (it draws each epoch's worker seeds)
goes on as in a run that never stopped, instead of drawing the interrupted epoch's seed a second time."""
from __future__ import annotations

import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.train.config_fit import fit

# 24 training samples, batch 4: 6 steps an epoch; step 9 is in the middle of epoch 2.
SMALL = dict(model="mlp", dataset="synthetic", synthetic_samples=32, synthetic_shape=(1, 4, 4), hidden=8,
             batch_size=4, threads=1, tensorboard=False, epochs=2, val_fraction=0.25)


def final_loader_state(tmp_path, name: str) -> torch.Tensor:
    newest = checkpoint.candidates(tmp_path / name / "checkpoints")[0]
    saved = checkpoint.load(newest)
    assert saved["progress"]["step"] == 12
    return saved["rng"][0]["loader"]


def test_a_mid_epoch_resume_leaves_the_loader_generator_where_an_uninterrupted_run_does(tmp_path, one_worker):
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="whole"))
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="stopped", max_steps=9))
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="stopped", resume="auto"))
    assert torch.equal(final_loader_state(tmp_path, "stopped"), final_loader_state(tmp_path, "whole"))
