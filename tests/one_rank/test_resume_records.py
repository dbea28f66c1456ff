"""Tier 2: what a resumed run records and restores beyond the weights (issue 33, smaller items)."""
from __future__ import annotations

import torch
from support.runs import records

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.train.config_fit import fit

# 24 training samples, batch 4: 6 steps an epoch.
SMALL = dict(model="mlp", dataset="synthetic", synthetic_samples=32, synthetic_shape=(1, 4, 4), hidden=8,
             batch_size=4, threads=1, tensorboard=False, epochs=100, val_fraction=0.25)


def test_a_run_ending_at_max_steps_mid_epoch_writes_a_final_checkpoint(tmp_path, one_worker):
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="run", max_steps=9))
    newest = checkpoint.candidates(tmp_path / "run" / "checkpoints")[0]
    assert checkpoint.load(newest)["progress"]["step"] == 9


def test_resumed_epochs_are_marked_in_metrics_jsonl_and_the_loader_rng_is_restored(tmp_path, one_worker):
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="whole", max_steps=12, keep_checkpoints=5))
    folder = tmp_path / "whole" / "checkpoints"
    first = next(p for p in checkpoint.candidates(folder) if checkpoint.load(p)["progress"]["step"] == 6)
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="whole", max_steps=12, keep_checkpoints=5,
                    resume=str(first)))
    epochs = [(r["epoch"], r.get("resumed", False)) for r in records(tmp_path / "whole", "epoch")]
    assert epochs == [(0, False), (1, False), (1, True)]
    # The redone epoch 2 drew its loader seeds as the first run did: the generators end alike.
    whole = checkpoint.load(folder / "ckpt-000000012.pt")["rng"][0]["loader"]
    redone = checkpoint.load(checkpoint.candidates(folder)[0])["rng"][0]["loader"]
    assert torch.equal(whole, redone)
