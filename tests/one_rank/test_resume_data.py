"""Tier 2: a resume over other data is refused (issue 36 item 8): every data-defining config key, and the
data's own fingerprint (files added to an images:DIR folder, another CSV)."""
from __future__ import annotations

import dataclasses
import inspect
import os
import re

import pytest
import torch
from torch.utils.data import TensorDataset

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint import resume
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data import datasets, fingerprint
from hvdtrain.errors import UserError
from hvdtrain.train.config_fit import fit

FAST = dict(model="mlp", hidden=8, batch_size=4, threads=1, tensorboard=False, epochs=100, checkpoint_steps=3)


def test_every_config_key_that_builds_the_data_is_guarded():
    """Review defect: features, label and image_size were left out, so --label other trained on other targets."""
    source = inspect.getsource(datasets)
    read = set(re.findall(r"config\.(\w+)", source)) & {f.name for f in dataclasses.fields(TrainConfig)}
    assert read - set(resume.MID_EPOCH_KEYS) <= set(resume.DATA_KEYS), read - set(resume.DATA_KEYS)
    assert {"features", "label", "image_size"} <= set(resume.DATA_KEYS)


def test_a_changed_label_or_features_is_named_with_the_flag_to_pass():
    saved = TrainConfig(dataset="csv:a.csv").to_dict()
    text = resume.config_conflict(saved, TrainConfig(dataset="csv:a.csv", label="y2").to_dict(), mid_epoch=False)
    assert text and "label 'label'" in text and "other targets" in text and "--label label," in text, text
    text = resume.config_conflict(saved, TrainConfig(dataset="csv:a.csv", features="a").to_dict(), mid_epoch=False)
    assert text and "--features ''," in text, text


def _csv(path, rows: int = 40):
    lines = ["a,b,label,other"] + [f"{i % 7},{(i * 3) % 5},{i % 2},{(i // 2) % 2}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_resume_with_another_label_is_refused(tmp_path, one_worker):
    _csv(tmp_path / "t.csv")
    base = dict(FAST, dataset=f"csv:{tmp_path / 't.csv'}", run_dir=str(tmp_path), name="run")
    fit(load_config(**base, max_steps=3))
    with pytest.raises(UserError, match=r"label 'label', this run has 'other'.*other targets; pass --label label"):
        fit(load_config(**base, label="other", resume="auto", max_steps=6))


def _images(root, count: int, start: int = 0):
    from PIL import Image

    for i in range(start, start + count):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i * 20 % 256, 0, 0)).save(folder / f"{i:03d}.png")


def test_resume_over_an_image_folder_with_a_new_file_is_refused_then_accepted_with_the_flag(tmp_path, one_worker,
                                                                                             capsys):
    """Review defect: a new image re-drew the permutation and the held-out split of a resumed run, silently."""
    _images(tmp_path / "img", 20)
    base = dict(FAST, dataset=f"images:{tmp_path / 'img'}", image_size=8, run_dir=str(tmp_path), name="run")
    fit(load_config(**base, max_steps=3))
    folder = tmp_path / "run" / "checkpoints"
    what = checkpoint.load(checkpoint.candidates(folder)[0])["data"]["what"]
    assert what.startswith("train: 16 files, ") and ", val: 4 files, " in what, what
    _images(tmp_path / "img", 1, start=20)
    with pytest.raises(UserError) as raised:
        fit(load_config(**base, resume="auto", max_steps=6))
    text = str(raised.value)
    assert "\n" not in text and "the data changed since the checkpoint" in text, text
    assert "train: 16 files" in text and "train: 17 files" in text and "--resume-changed-data accept" in text, text
    capsys.readouterr()
    history = fit(load_config(**base, resume="auto", max_steps=6, resume_changed_data="accept"))
    assert history.summary["steps"] == 6
    assert "resumed over it (--resume-changed-data accept)" in capsys.readouterr().out


def test_an_unchanged_image_folder_resumes_without_a_word(tmp_path, one_worker, capsys):
    _images(tmp_path / "img", 20)
    base = dict(FAST, dataset=f"images:{tmp_path / 'img'}", image_size=8, run_dir=str(tmp_path), name="run")
    fit(load_config(**base, max_steps=3))
    capsys.readouterr()
    fit(load_config(**base, resume="auto", max_steps=6))
    out = capsys.readouterr().out
    assert "resumed from" in out and "data changed" not in out


def test_the_fingerprint_follows_content_and_file_lists_not_the_mount_point(tmp_path):
    from hvdtrain.data.images import image_folder

    data = torch.arange(12.0).view(6, 2)
    same = fingerprint.fingerprint(TensorDataset(data.clone()))
    assert fingerprint.changed(same, fingerprint.fingerprint(TensorDataset(data))) is None
    edited = data.clone()
    edited[3, 1] = -1
    text = fingerprint.changed(same, fingerprint.fingerprint(TensorDataset(edited)))
    assert text and "content differ" in text
    _images(tmp_path / "a", 6)
    (tmp_path / "b").mkdir()
    for path in (tmp_path / "a").rglob("*.png"):      # the same files elsewhere (times kept, like rsync -t)
        target = tmp_path / "b" / path.relative_to(tmp_path / "a")
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes())
        stat = path.stat()
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    a = fingerprint.fingerprint(*image_folder(str(tmp_path / "a"), 8, 0.25, 1)[:2])
    b = fingerprint.fingerprint(*image_folder(str(tmp_path / "b"), 8, 0.25, 1)[:2])
    assert fingerprint.changed(a, b) is None
    assert fingerprint.changed(None, b) is None      # a checkpoint from before fingerprints: not compared
