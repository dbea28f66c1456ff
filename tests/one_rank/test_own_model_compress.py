"""Compress and predict a run of the user's own model class (issue 52): the run records how to rebuild it
(model.json) and is named after it; `hvdtrain compress` and `hvdtrain predict` rebuild that architecture with
its constructor arguments; a model that cannot be rebuilt is one line naming why and `--model module:function`.

Models are trained here with the Trainer in this process (one worker, digits, one thread); the commands run
as the user runs them, in fresh processes that import the model's module from PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support.paths import PLUGINS, ROOT
from support.processes import show
from user_models import TinyEncoder, WideMLP  # noqa: E402

import hvdtrain
from hvdtrain.compression.export import load_exported
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model

FIX = "pass --model module:function, a builder (config, input_shape, num_classes) that returns the trained model"


def train(model: torch.nn.Module, root: Path, epochs: int, **config) -> Path:
    """Train `model` with the Trainer on digits; the run folder it wrote."""
    config = hvdtrain.load_config(epochs=epochs, threads=1, run_dir=str(root), tensorboard=False, optimizer="adam",
                                  lr=0.005, **config)
    data = build_data(config)
    with hvdtrain.Trainer(model, data.train, data.val, config=config) as trainer:
        history = trainer.fit()
    return Path(history.summary["run_dir"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A WideMLP(width=24, depth=3, activation='gelu') run (6 epochs) and a TinyEncoder run (1 epoch), which
    keeps none of its constructor arguments."""
    root = tmp_path_factory.mktemp("own-model")
    torch.manual_seed(0)
    wide = train(WideMLP(24, depth=3, activation="gelu"), root, 6)
    torch.manual_seed(1)
    encoder = train(TinyEncoder(width=16), root, 1, name="encoder")
    return {"wide": wide, "encoder": encoder}


def hvdtrain_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", *args], cwd=ROOT, env={**os.environ, **PLUGINS},
                          capture_output=True, text=True, timeout=300)


def val_set(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    data = build_data(hvdtrain.load_config(str(run / "config.yaml")))
    return data.val.tensors[0], data.val.tensors[1]


def trained_wide(run: Path) -> WideMLP:
    """The trained model, rebuilt by hand: the architecture the user built, the weights the run saved."""
    model = WideMLP(24, depth=3, activation="gelu")
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    return model.eval()


def test_the_run_is_named_after_the_class_and_records_how_to_rebuild_it(runs):
    run = runs["wide"]
    assert run.name.startswith("widemlp-digits-"), run.name     # not cnn-digits-...
    assert yaml.safe_load((run / "config.yaml").read_text())["model"] == "user_models:WideMLP"
    record = json.loads((run / "model.json").read_text())
    assert record["class"] == "user_models:WideMLP" and record["why_not"] == ""
    assert record["args"] == {"width": "24", "depth": "3", "classes": "10", "activation": "'gelu'", "inputs": "64"}
    assert runs["encoder"].name == "encoder"
    assert "takes `width`, which the model does not keep" in json.loads(
        (runs["encoder"] / "model.json").read_text())["why_not"]


def test_compress_int8_and_predict_rebuild_the_users_architecture(runs, tmp_path):
    run, out = runs["wide"], tmp_path / "wide-int8"
    user = trained_wide(run)
    inputs, labels = val_set(run)
    with torch.no_grad():
        expected = user(inputs)
    accuracy = (expected.argmax(1) == labels).float().mean().item()
    assert accuracy >= 0.85, accuracy   # trained: the int8 comparison below means something

    proc = hvdtrain_cli("compress", str(run), "--method", "int8", "--out", str(out), "--repeats", "5")
    assert proc.returncode == 0, show(proc)
    report = json.loads((out / "report.json").read_text())
    original, int8 = report["models"]
    # The model compressed is the user's: its parameters, its Linear layers, its accuracy, its layer names.
    cnn = build_model(hvdtrain.load_config(model="cnn"), (1, 8, 8), 10)
    assert original["params"] == sum(p.numel() for p in user.parameters()) != sum(p.numel() for p in cnn.parameters())
    assert original["val_acc"] == pytest.approx(accuracy)
    assert report["details"]["int8_mode"] == "dynamic"
    assert report["details"]["int8_layers"] == ["layers.1", "layers.3", "layers.5", "layers.7"]
    assert torch.load(out / "compressed.pt", weights_only=False).keys() == user.state_dict().keys()
    assert yaml.safe_load((out / "config.yaml").read_text())["model"] == "user_models:WideMLP"
    with torch.no_grad():
        exported = load_exported(out / "model.pt2")(inputs)
    agreement = (exported.argmax(1) == expected.argmax(1)).float().mean().item()
    print(f"\nint8 WideMLP: acc {original['val_acc']:.4f} -> {int8['val_acc']:.4f}, bytes {original['bytes']} -> "
          f"{int8['bytes']}, argmax agreement with the float model {agreement:.4f}")
    assert agreement >= 0.97 and abs(int8["val_acc"] - original["val_acc"]) <= 0.02
    assert report["export"]["ok"]

    # predict rebuilds the same model (and the compressed one from its export), in a fresh process.
    proc = hvdtrain_cli("predict", "--checkpoint", str(run), "--out", str(tmp_path / "float.pt"))
    assert proc.returncode == 0, show(proc)
    torch.testing.assert_close(torch.load(tmp_path / "float.pt"), expected, atol=1e-6, rtol=0)
    proc = hvdtrain_cli("predict", "--checkpoint", str(out), "--out", str(tmp_path / "int8.pt"))
    assert proc.returncode == 0, show(proc)
    torch.testing.assert_close(torch.load(tmp_path / "int8.pt"), exported, atol=1e-6, rtol=0)


def test_a_model_that_cannot_be_rebuilt_is_one_line_and_a_builder_fixes_it(runs, tmp_path):
    run = runs["encoder"]
    why = (f"{run} was trained with the model user_models:TinyEncoder, which hvdtrain cannot rebuild: "
           "TinyEncoder.__init__ takes `width`, which the model does not keep as self.width; " + FIX)
    proc = hvdtrain_cli("predict", "--checkpoint", str(run), "--out", str(tmp_path / "p.pt"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"hvdtrain: error: {why}"], show(proc)
    proc = hvdtrain_cli("compress", str(run), "--method", "int8", "--out", str(tmp_path / "enc-int8"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"hvdtrain: error: {why}"], show(proc)
    assert not (tmp_path / "p.pt").exists() and not (tmp_path / "enc-int8").exists()   # nothing half-written

    # --model names a builder of the same architecture: predict gives the trained model's outputs.
    model = TinyEncoder(width=16)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    inputs, _ = val_set(run)
    with torch.no_grad():
        expected = model.eval()(inputs)
    proc = hvdtrain_cli("predict", "--checkpoint", str(run / "model.pt"), "--model", "user_models:tiny_encoder",
                        "--out", str(tmp_path / "p.pt"))
    assert proc.returncode == 0, show(proc)
    torch.testing.assert_close(torch.load(tmp_path / "p.pt"), expected, atol=1e-6, rtol=0)
    # A builder of another architecture is refused by the weights, never used silently.
    proc = hvdtrain_cli("predict", "--checkpoint", str(run), "--model", "mlp", "--out", str(tmp_path / "q.pt"))
    assert proc.returncode == 2 and "does not fit the model of its config (mlp)" in proc.stderr, show(proc)
    assert not (tmp_path / "q.pt").exists()
