"""Tier 2: a run resumed mid-epoch trains on the same random augmentations as one never stopped (issue 33)."""
from __future__ import annotations

import pytest
import torch
from augment_probe import TRAINED

from hvdtrain.config.train_config import load_config
from hvdtrain.train.config_fit import fit

# 48 training samples, batch 4: 12 steps an epoch; the stop at step 17 is in the middle of epoch 2.
SMALL = dict(model="augment_probe:recording_mlp", dataset="augment_probe:jittered_synthetic",
             synthetic_samples=64, synthetic_shape=(1, 4, 4), hidden=8, batch_size=4, threads=1,
             tensorboard=False, epochs=2, val_fraction=0.25, checkpoint_epochs=0)


def trained(**options) -> torch.Tensor:
    TRAINED.clear()
    fit(load_config(**SMALL, **options))
    return torch.cat(TRAINED)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_resumed_mid_epoch_trains_the_augmentations_of_an_uninterrupted_run(tmp_path, one_worker, workers):
    whole = trained(run_dir=str(tmp_path), name="whole", workers=workers)
    first = trained(run_dir=str(tmp_path), name="stopped", workers=workers, max_steps=17)
    rest = trained(run_dir=str(tmp_path), name="stopped", workers=workers, resume="auto")
    assert len(whole) == 2 * 48 and len(first) + len(rest) == len(whole)
    assert torch.equal(torch.cat([first, rest]), whole)
