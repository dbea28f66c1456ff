"""Tier 1: built-in and plug-in models."""
import pytest
import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model


@pytest.mark.parametrize("name, shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("cnn", (3, 28, 28)),
                                         ("mlp", (20,))])
def test_builtin_models_map_inputs_to_class_logits(name, shape):
    model = build_model(TrainConfig(model=name), shape, 7)
    assert model(torch.randn(5, *shape)).shape == (5, 7)


def test_cnn_refuses_flat_inputs_with_a_fix():
    with pytest.raises(UserError, match="use --model mlp"):
        build_model(TrainConfig(model="cnn"), (20,), 3)


def test_unknown_model_lists_the_choices():
    with pytest.raises(UserError, match="unknown model 'resnet'; choose one of mlp, cnn"):
        build_model(TrainConfig(model="resnet"), (4,), 2)


def test_plugin_must_return_a_module(tmp_path, monkeypatch):
    (tmp_path / "badmodel.py").write_text("def build(config, shape, classes):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="must return a torch.nn.Module, got int"):
        build_model(TrainConfig(model="badmodel:build"), (4,), 2)


def test_resnet18_width_keeps_the_graph_and_shrinks_it():
    from hvdtrain.models.zoo import resnet18

    full, narrow = resnet18(3, 10), resnet18(3, 10, width=8)
    assert sum(p.numel() for p in full.parameters()) == 11_181_642  # torchvision's resnet18 at 10 classes
    assert len(list(full.modules())) == len(list(narrow.modules()))
    assert sum(p.numel() for p in narrow.parameters()) < 200_000
    assert narrow(torch.randn(2, 3, 16, 16)).shape == (2, 10)
