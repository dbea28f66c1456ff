"""Tier 2: checkpoints ordered by when they were written on the live branch (issue 33)."""
from __future__ import annotations

import pytest

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.errors import UserError
from hvdtrain.train.config_fit import fit

# 32 samples x 0.75 for training, batch 4: 6 steps an epoch, milliseconds each.
SMALL = dict(model="mlp", dataset="synthetic", synthetic_samples=32, synthetic_shape=(1, 4, 4), hidden=8,
             batch_size=4, threads=1, tensorboard=False, epochs=100, val_fraction=0.25)


def steps_kept(folder):
    return [(checkpoint.load(p)["progress"]["step"], p.name) for p in checkpoint.candidates(folder)]


def test_a_rollback_keeps_its_new_checkpoints_and_resume_auto_continues_it(tmp_path, one_worker, capsys):
    """Review defect: cleanup kept the highest step numbers, so after resuming step 150 into the same run
    the new branch's checkpoints were deleted and --resume auto went back to the abandoned step 180."""
    base = dict(SMALL, run_dir=str(tmp_path), name="run", checkpoint_steps=10, checkpoint_epochs=0,
                keep_checkpoints=4)
    fit(load_config(**base, max_steps=180))
    folder = tmp_path / "run" / "checkpoints"
    assert [s for s, _ in steps_kept(folder)] == [180, 170, 160, 150]
    oldest = checkpoint.candidates(folder)[-1]
    fit(load_config(**base, max_steps=162, resume=str(oldest)))
    kept = steps_kept(folder)
    assert kept[0][0] in (160, 162) and len(kept) == 4, kept      # the live branch's newest comes first
    capsys.readouterr()
    history = fit(load_config(**base, max_steps=168, resume="auto"))
    assert f"resumed from {folder / kept[0][1]} at epoch 27, step {kept[0][0]}" in capsys.readouterr().out
    assert history.summary["steps"] == 168


def test_an_unreadable_newest_checkpoint_is_moved_aside_and_holds_no_keep_slot(tmp_path, one_worker, capsys):
    base = dict(SMALL, run_dir=str(tmp_path), name="run", checkpoint_steps=6, keep_checkpoints=1)
    fit(load_config(**base, max_steps=12))
    folder = tmp_path / "run" / "checkpoints"
    (folder / "ckpt-000000018.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    fit(load_config(**base, max_steps=24, resume="auto"))
    out = capsys.readouterr()
    assert (out.out + out.err).count("moved aside") == 1
    assert (folder / "ckpt-000000018.pt.unreadable").read_bytes() == b"not a checkpoint"
    assert [s for s, _ in steps_kept(folder)] == [24]
    assert isinstance(checkpoint.load(checkpoint.candidates(folder)[0])["model"], dict)


def test_resuming_with_another_seed_is_refused(tmp_path, one_worker):
    """Review defect: --seed 7 over a seed-42 run re-split train and held-out data with no word."""
    base = dict(SMALL, run_dir=str(tmp_path), name="run")
    fit(load_config(**base, max_steps=6))
    with pytest.raises(UserError, match=r"seed .*--seed 42"):
        newest = checkpoint.candidates(tmp_path / "run" / "checkpoints")[0]
        fit(load_config(**base, max_steps=12, seed=7, resume=str(newest)))


def test_resume_auto_refuses_a_newest_checkpoint_of_another_format_version(tmp_path, one_worker):
    """Issue 36: it was moved aside as *.unreadable and the run quietly went on from an older checkpoint."""
    import torch

    base = dict(SMALL, run_dir=str(tmp_path), name="run", checkpoint_steps=6, keep_checkpoints=3)
    fit(load_config(**base, max_steps=12))
    folder = tmp_path / "run" / "checkpoints"
    other = folder / "ckpt-000000018.pt"
    torch.save({**checkpoint.load(folder / "ckpt-000000012.pt"), "format": "hvdtrain-checkpoint-3"}, other)
    before = other.read_bytes()
    with pytest.raises(UserError) as raised:
        fit(load_config(**base, max_steps=24, resume="auto"))
    text = str(raised.value)
    assert "\n" not in text and "hvdtrain-checkpoint-3" in text and checkpoint.FORMAT in text, text
    assert other.read_bytes() == before
    assert [p.name for p in checkpoint.candidates(folder)] == [other.name, "ckpt-000000012.pt", "ckpt-000000006.pt"]
