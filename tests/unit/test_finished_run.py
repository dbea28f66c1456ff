"""`trained.finished_run`: a run directory, its model.pt or a checkpoint read back into the trained model,
and `checkpoint.read_weights` reading a file once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config, to_yaml
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.trained import finished_run


@pytest.fixture
def run(tmp_path) -> tuple[Path, torch.nn.Module]:
    """A run directory as training leaves it (config.yaml, model.pt), with an untrained mlp on digits."""
    config = load_config(model="mlp", hidden=16, seed=3)
    data = build_data(config)
    torch.manual_seed(0)
    model = build_model(config, input_shape(data.train), data.num_classes).eval()
    path = tmp_path / "mlp"
    path.mkdir()
    (path / "config.yaml").write_text(to_yaml(config))
    torch.save(model.state_dict(), path / "model.pt")
    return path, model


def test_a_run_directory_reads_back_into_the_same_model_and_data(run):
    path, model = run
    back = finished_run.read(path)
    inputs = torch.stack([back.data.val[i][0] for i in range(8)])
    torch.testing.assert_close(back.model(inputs), model(inputs), atol=0, rtol=0)
    assert (back.path, back.weights_file, back.model_bytes) == (path, path / "model.pt",
                                                                 (path / "model.pt").stat().st_size)
    assert back.config.hidden == 16 and back.input_shape == (1, 8, 8) and not back.model.training


def test_a_checkpoint_reads_back_with_its_own_config_and_its_run_directory(run):
    path, model = run
    config = finished_run.read_config(path)
    saved = checkpoint.save(checkpoint.checkpoint_dir(path), 7, {"model": model.state_dict(),
                                                                 "config": config.to_dict()}, keep=1)
    (path / "config.yaml").unlink()  # the checkpoint alone says how to rebuild the model
    back = finished_run.read(saved, dataset="digits")
    assert back.path == path and back.weights_file == saved
    inputs = torch.rand(4, 1, 8, 8)
    torch.testing.assert_close(back.model(inputs), model(inputs), atol=0, rtol=0)


def test_rebuilding_does_not_move_the_callers_random_numbers(run):
    path, _ = run
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    finished_run.read(path)
    torch.testing.assert_close(torch.rand(3), expected)


def test_read_weights_loads_a_checkpoint_once(run, monkeypatch):
    path, model = run
    saved = checkpoint.save(checkpoint.checkpoint_dir(path), 1, {"model": model.state_dict(),
                                                                 "config": {"model": "mlp"}}, keep=1)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    state, config = checkpoint.read_weights(saved)
    # torch.load reads through a handle that keeps storage errors (checkpoint._torch_load): one read, of `saved`.
    assert [Path(getattr(f, "name", f)) for f in loads] == [saved]
    assert config == {"model": "mlp"} and state.keys() == model.state_dict().keys()


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path):
    torch.save({"format": "hvdtrain-checkpoint-1", "model": {}}, tmp_path / "old.pt")
    with pytest.raises(UserError, match=r"old.pt is checkpoint format hvdtrain-checkpoint-1, this hvdtrain reads "
                                        r"hvdtrain-checkpoint-2: .*the file is left as it is$"):
        checkpoint.read_weights(tmp_path / "old.pt")


@pytest.mark.parametrize("case, message", [
    ("missing directory", "run directory {path}-gone does not exist"),
    ("no model.pt", "{path} has no model.pt (a finished training run writes it)"),
    ("no config.yaml", "{path}/model.pt holds weights only and there is no {path}/config.yaml"),
    ("weights of another model", "{path}/model.pt does not fit the model of its config (mlp): "),
])
def test_a_run_that_cannot_be_read_is_one_line(run, case, message):
    path, _ = run
    target = path
    if case == "missing directory":
        target = path.with_name("mlp-gone")
    elif case == "no model.pt":
        (path / "model.pt").unlink()
    elif case == "no config.yaml":
        (path / "config.yaml").unlink()
    else:
        torch.save({"other.weight": torch.zeros(2)}, path / "model.pt")
    with pytest.raises(UserError) as err:
        finished_run.read(target)
    text = str(err.value)
    assert text.startswith(message.format(path=path)) and "\n" not in text, text
