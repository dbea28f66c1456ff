"""Tier 2: the checkpoint file format did not change when the Checkpointer began saving stateful components
generically (checkpoint/stateful.py): a file written before that resumes with every component restored, a file
written now holds exactly the keys and structure the old code wrote (so the old code reads it too), and a
payload built by hand from the documented keys alone resumes exactly."""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.models.builtin import build_model
from hvdtrain.output.plain_weights import plain_state_dict
from hvdtrain.train.config_fit import fit
from hvdtrain.train.trainer import Trainer

# Written by hvdtrain 1ac75a8 (the hand-built payload, before stateful components) with SMALL and max_steps=9:
# one worker, stopped in the middle of epoch 2 (6 steps an epoch).
FIXTURE = Path(__file__).parent / "fixtures" / "format2-mlp-step9.pt"
DOCUMENTED = {"format", "model", "optimizer", "progress", "world_size", "rng", "stats", "config", "data"}
SMALL = dict(model="mlp", dataset="synthetic", synthetic_samples=32, synthetic_shape=(1, 4, 4), hidden=8,
             batch_size=4, threads=1, tensorboard=False, epochs=2, val_fraction=0.25)


def same(a: Any, b: Any) -> bool:
    """Equal values, tensors and NaNs included, through dicts, lists and tuples."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def shape_of(value: Any) -> Any:
    """The structure of a payload: keys, list lengths and leaf types, not the numbers."""
    if isinstance(value, dict):
        return {key: shape_of(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [shape_of(item) for item in value]
    return type(value).__name__


def test_a_checkpoint_of_the_old_layout_restores_every_component(tmp_path, one_worker):
    old = checkpoint.load(FIXTURE)
    assert set(old) == DOCUMENTED
    config = load_config(**SMALL, run_dir=str(tmp_path), name="resumed", resume=str(FIXTURE))
    data = build_data(config)
    model = build_model(config, input_shape(data.train), data.num_classes)
    with Trainer(model, data.train, data.val, config=config) as trainer:
        progress = trainer.progress.values(stats=False)
        assert same(progress, {**old["progress"], "branch": progress["branch"]})   # a new run folder: its own line
        assert same(trainer.progress.stats, old["stats"][0])
        assert same(plain_state_dict(trainer.model), old["model"])
        assert same(trainer.optimizer.state_dict(), old["optimizer"])
        saved_rng = old["rng"][0]
        assert same(trainer.loader.generator.get_state(), saved_rng["loader"])
        assert same(torch.get_rng_state(), saved_rng["torch"])
        assert same(list(random.getstate()), list(saved_rng["python"]))
        assert np.array_equal(np.random.get_state(legacy=True)[1], saved_rng["numpy"][0].numpy())
        history = trainer.fit()
    assert history.summary["steps"] == 12 and history.summary["epochs_run"] == 1


def test_a_checkpoint_written_now_has_the_old_layout(tmp_path, one_worker):
    fit(load_config(**SMALL, run_dir=str(tmp_path), name="new", max_steps=9))
    new = checkpoint.load(tmp_path / "new" / "checkpoints" / "ckpt-000000009.pt")
    old = checkpoint.load(FIXTURE)
    assert set(new) == DOCUMENTED
    layout = {key: shape_of(new[key]) for key in DOCUMENTED - {"config"}}
    assert layout == {key: shape_of(old[key]) for key in DOCUMENTED - {"config"}}
    assert new["config"].keys() >= old["config"].keys()     # new options may add keys; none go


def test_a_payload_of_only_the_documented_keys_resumes_exactly(tmp_path, one_worker):
    # Step 9 of a run that went on (with max_steps=9 the LR schedule would end there).
    whole = fit(load_config(**SMALL, run_dir=str(tmp_path), name="whole", checkpoint_steps=9))
    written = checkpoint.load(tmp_path / "whole" / "checkpoints" / "ckpt-000000009.pt")
    progress_keys = ("epoch", "position", "step", "fit_step", "nonfinite", "skipped", "best", "best_epoch",
                     "branch", "resplits")
    rng_keys = ("torch", "python", "numpy", "loader")
    by_hand = {"format": checkpoint.FORMAT, "model": dict(written["model"]), "optimizer": written["optimizer"],
               "progress": {key: written["progress"][key] for key in progress_keys}, "world_size": 1,
               "rng": [{key: written["rng"][0][key] for key in rng_keys}], "stats": [written["stats"][0]],
               "config": written["config"], "data": written["data"]}
    path = tmp_path / "by_hand.pt"
    torch.save(by_hand, path)
    resumed = fit(load_config(**SMALL, run_dir=str(tmp_path), name="resumed", resume=str(path)))
    assert resumed.summary["param_digests"] == whole.summary["param_digests"]
    assert resumed.summary["steps"] == whole.summary["steps"] == 12
    assert resumed[-1]["train_loss"] == whole[-1]["train_loss"]   # the epoch's metric sums came back too
