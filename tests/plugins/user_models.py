"""Test plug-ins shaped like real user code: dict batches (with ids that are not tensors), a
transformer-style encoder defined here (random init, no download), and a model with two outputs."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from hvdtrain.data.datasets import digits


class DictDigits(Dataset):
    """digits as {"features": 64 floats, "label": class, "id": a string} (the Hugging Face shape)."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict:
        x, y = self.base[index]
        return {"features": x.flatten(), "label": y, "id": f"sample-{index}"}


def dict_digits(config):
    data = digits(config)
    return DictDigits(data.train), DictDigits(data.val), 10


class TinyEncoder(nn.Module):
    """8 tokens (rows of the 8x8 image) -> one transformer encoder layer -> mean -> class logits."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.position = nn.Parameter(torch.zeros(8, width))
        self.encoder = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.0,
                                                  batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(features.view(-1, 8, 8)) + self.position
        return self.head(self.encoder(tokens).mean(1))


def dict_step(model: nn.Module, batch: dict):
    """The hook: what the model takes from the batch, its loss, and a metric of our own."""
    logits = model(batch["features"])
    loss = nn.functional.cross_entropy(logits, batch["label"])
    return loss, {"batch_acc": (logits.argmax(1) == batch["label"]).float().mean()}


class TwoHeads(nn.Module):
    """Returns (logits, aux): a classifier plus a reconstruction of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU())
        self.classes, self.decoder = nn.Linear(64, 10), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor):
        hidden = self.body(x)
        return self.classes(hidden), self.decoder(hidden)


def two_heads_loss(outputs, targets):
    logits, _ = outputs
    return nn.functional.cross_entropy(logits, targets)


class WideMLP(nn.Module):
    """An MLP whose architecture is its constructor arguments, each kept as the attribute of the same name:
    what lets hvdtrain rebuild it for predict and compress (model.json)."""

    def __init__(self, width: int, depth: int = 2, classes: int = 10, activation: str = "relu",
                 inputs: int = 64) -> None:
        super().__init__()
        self.width, self.depth, self.classes, self.activation = width, depth, classes, activation
        self.inputs = inputs
        act = {"relu": nn.ReLU, "gelu": nn.GELU}[activation]
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(inputs, width), act()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), act()]
        self.layers = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def tiny_encoder(config, input_shape, num_classes):
    """A builder for `--model user_models:tiny_encoder`: TinyEncoder keeps none of its arguments, so hvdtrain
    cannot rebuild a run of it by itself."""
    return TinyEncoder(width=16, classes=num_classes)
