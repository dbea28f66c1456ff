"""A full disk while rank 0 writes a checkpoint: a one-line error, the previous checkpoint intact and
loadable, nothing half-written left as the newest. The disk is a small tmpfs this test mounts (root)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.trainer import Trainer


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, unmounted again even when the test fails."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    """Take all the space that is left."""
    with (disk / "filler").open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(small_disk, one_worker):
    config = load_config(model="mlp", epochs=3, threads=1, tensorboard=False, run_dir=str(small_disk), name="r")
    data = build_data(config)
    trainer = Trainer(build_model(config, input_shape(data.train), data.num_classes), data.train, data.val,
                      config=config)

    def after_epoch(record: dict) -> bool:
        if record["epoch"] == 1:   # epoch 1's checkpoint comes next: leave it no room
            fill(small_disk)
        return False

    with pytest.raises(UserError) as err:
        trainer.fit(after_epoch=after_epoch)
    message = str(err.value)
    assert "\n" not in message and "cannot write" in message and "No space left on device" in message, message
    directory = small_disk / "r" / "checkpoints"
    assert not list(directory.glob(".*.tmp")), "a half-written checkpoint was left behind"
    newest = checkpoint.candidates(directory)[0]
    assert newest.name == "ckpt-000000045.pt"    # epoch 1's (45 steps per epoch); epoch 2's was refused
    payload = checkpoint.load(newest)
    assert payload["progress"]["epoch"] == 1 and payload["progress"]["position"] == 0
    model = build_model(config, input_shape(data.train), data.num_classes)
    model.load_state_dict(payload["model"])        # loadable, whole
    assert all(torch.isfinite(t).all() for t in payload["model"].values())
