"""`hvdtrain predict`: sharded inference under horovodrun, a local process pool, and one process."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.paths import PLUGINS, ROOT
from support.processes import horovodrun, show
from user_models import WideMLP  # noqa: E402

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config, to_yaml
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model
from hvdtrain.models.recipe import describe
from hvdtrain.train.evaluation import interleave

# 2002 samples, half held out: 1001 predictions, shards of 334/334/333 over 3 ranks.
JOB = dict(dataset="synthetic", synthetic_samples=2002, val_fraction=0.5, synthetic_shape=(10,), model="mlp",
           hidden=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint and a model.pt + config.yaml of the same weights, and the expected outputs."""
    root = tmp_path_factory.mktemp("predict")
    config = load_config(**JOB)
    data = build_data(config)
    torch.manual_seed(123)  # not the config seed: the file's weights, not a rebuilt init, must be used
    model = build_model(config, (10,), data.num_classes)
    torch.save({"format": checkpoint.FORMAT, "model": model.state_dict(), "config": config.to_dict()},
               root / "ckpt-000000010.pt")
    (root / "run").mkdir()
    torch.save(model.state_dict(), root / "run" / "model.pt")
    save_file(model.state_dict(), root / "run" / "model.safetensors")
    (root / "run" / "config.yaml").write_text(to_yaml(config))
    inputs = torch.stack([data.val[i][0] for i in range(len(data.val))])
    with torch.no_grad():
        expected = model.eval()(inputs)
    assert len(expected) == 1001
    return root, expected


# A user's model class is imported from its module in every rank and pool process.


def run_predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", "predict", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **PLUGINS})


def test_three_ranks_write_1001_outputs_in_order(trained, tmp_path):
    root, expected = trained
    out = tmp_path / "three.pt"
    proc = horovodrun(3, ["-m", "hvdtrain", "predict", "--checkpoint", str(root / "ckpt-000000010.pt"),
                          "--out", str(out), "--batch-size", "100"], "gloo")
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.count("wrote 1001 predictions") == 1, show(proc)  # rank 0 only
    outputs = torch.load(out, weights_only=True)
    assert outputs.shape == expected.shape
    torch.testing.assert_close(outputs, expected, atol=1e-6, rtol=0)


def test_one_process_and_a_process_pool_agree(trained, tmp_path):
    root, expected = trained
    one = run_predict("--checkpoint", str(root / "ckpt-000000010.pt"), "--out", str(tmp_path / "one.pt"))
    assert one.returncode == 0, show(one)
    torch.testing.assert_close(torch.load(tmp_path / "one.pt", weights_only=True), expected, atol=1e-6, rtol=0)
    pool = run_predict("--checkpoint", str(root / "run" / "model.pt"), "--out", str(tmp_path / "pool.npy"),
                       "--procs", "3", "--batch-size", "64")
    assert pool.returncode == 0, show(pool)
    assert "wrote 1001 predictions" in pool.stdout and "3 processes" in pool.stdout
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "pool.npy")), expected, atol=1e-6, rtol=0)


def test_safetensors_weights_predict_the_same(trained, tmp_path):
    root, expected = trained
    proc = run_predict("--checkpoint", str(root / "run" / "model.safetensors"), "--out", str(tmp_path / "st.pt"))
    assert proc.returncode == 0, show(proc)
    torch.testing.assert_close(torch.load(tmp_path / "st.pt", weights_only=True), expected, atol=1e-6, rtol=0)


def test_a_run_of_a_user_model_class_predicts_as_that_class_on_ranks_and_in_a_pool(tmp_path):
    """A Trainer run of WideMLP(12, depth=3) as it leaves its folder: config.yaml naming the class, model.pt and
    model.json; every rank and pool process rebuilds WideMLP(12, depth=3) from the record."""
    config = load_config(**{**JOB, "model": "user_models:WideMLP"})
    data = build_data(config)
    torch.manual_seed(5)
    model = WideMLP(12, depth=3, classes=data.num_classes, inputs=10).eval()
    run = tmp_path / "widemlp-synthetic"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(config))
    torch.save(model.state_dict(), run / "model.pt")
    describe(model).write(run)
    inputs = torch.stack([data.val[i][0] for i in range(len(data.val))])
    with torch.no_grad():
        expected = model(inputs)
    proc = horovodrun(2, ["-m", "hvdtrain", "predict", "--checkpoint", str(run), "--out", str(tmp_path / "two.pt")],
                      "gloo", env=PLUGINS)
    assert proc.returncode == 0, show(proc)
    torch.testing.assert_close(torch.load(tmp_path / "two.pt", weights_only=True), expected, atol=1e-6, rtol=0)
    pool = run_predict("--checkpoint", str(run), "--out", str(tmp_path / "pool.pt"), "--procs", "2")
    assert pool.returncode == 0, show(pool)
    torch.testing.assert_close(torch.load(tmp_path / "pool.pt", weights_only=True), expected, atol=1e-6, rtol=0)


def test_interleave_restores_the_order_of_uneven_shards():
    shards = [torch.tensor([0, 3, 6]), torch.tensor([1, 4]), torch.tensor([2, 5])]
    assert interleave(shards).tolist() == list(range(7))


def test_missing_checkpoint_is_one_line(tmp_path):
    proc = run_predict("--checkpoint", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o.pt"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"hvdtrain: error: checkpoint {tmp_path / 'nope.pt'} does not exist"], show(proc)
