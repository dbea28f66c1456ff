"""Tier 1: the built-in digits are scikit-learn's load_digits() exactly, read without importing scikit-learn."""
from __future__ import annotations

import subprocess
import sys

import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.datasets import digits, digits_arrays, split


def test_digits_arrays_equal_load_digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images, labels = digits_arrays()
    assert images.dtype == torch.float64 and labels.dtype == torch.int64
    assert torch.equal(images, torch.from_numpy(bunch.images))
    assert torch.equal(labels, torch.from_numpy(bunch.target).to(torch.int64))


def test_the_digits_split_equals_the_one_built_from_load_digits():
    # The split every equivalence test compares against was built from load_digits(): it must not move.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    inputs = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    targets = torch.tensor(bunch.target, dtype=torch.long)
    config = TrainConfig()
    want_train, want_val = split(inputs, targets, config.val_fraction, config.seed)
    data = digits(config)
    for got, want in ((data.train, want_train), (data.val, want_val)):
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, want.tensors, strict=True))


def test_building_the_digits_does_not_import_scikit_learn():
    # A fresh interpreter: this one has imported sklearn above.
    code = ("import sys\nfrom hvdtrain.config.train_config import TrainConfig\n"
            "from hvdtrain.data.datasets import digits\ndigits(TrainConfig())\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
