"""The benchmark workloads: model, synthetic data and step for each name in MODELS.

Four models, from comm-heavy to real-size:
  mlp          784-1024-1024-10, 1.86 M params, batch 64: little compute per gradient byte
  cnn          hvdtrain's built-in CNN at 28x28, 0.15 M params, batch 32: compute-heavy
  resnet18     hvdtrain's own ResNet-18 (random init) at 3x64x64, 11.2 M params, batch 8
  transformer  a 2-layer encoder (d 128, 4 heads) on 64 tokens, fed dict batches
               {"tokens": LongTensor[B, 64], "label": LongTensor[B]} through hvdtrain's step_fn

Model code never imports Horovod (hvdtrain's rule): the worker wraps these for each variant.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

# Per-rank batch sizes are what one CPU core gets through in ~10-150 ms; resnet18's is small so a
# full run stays affordable on a 2-core machine (its 45 MB of gradients make it comm-heavy there).
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp", "hidden": 1024, "batch_size": 64, "synthetic_shape": "1,28,28"},
    "cnn": {"model": "cnn", "hidden": 128, "batch_size": 32, "synthetic_shape": "1,28,28"},
    "resnet18": {"model": "resnet18", "batch_size": 8, "synthetic_shape": "3,64,64"},
    "transformer": {"model": "transformer", "batch_size": 16, "vocab": 1000, "seq": 64, "d_model": 128,
                    "heads": 4, "layers": 2, "ff": 512},
}
SMOKE_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp", "hidden": 64, "batch_size": 16, "synthetic_shape": "1,8,8"},
    "cnn": {"model": "cnn", "hidden": 16, "batch_size": 8, "synthetic_shape": "1,8,8"},
    # the same ResNet-18 graph at width 8 (0.18 M params): 45 MB of gradients would cost CI ~1 min
    "resnet18": {"model": "resnet18", "batch_size": 4, "synthetic_shape": "3,16,16", "width": 8},
    "transformer": {"model": "transformer", "batch_size": 4, "vocab": 50, "seq": 8, "d_model": 16,
                    "heads": 2, "layers": 1, "ff": 32},
}
# Keys that are the worker's own, not TrainConfig fields.
TOKEN_KEYS = ("vocab", "seq", "d_model", "heads", "layers", "ff")
OWN_KEYS = (*TOKEN_KEYS, "width")
NUM_CLASSES = 10


def spec_of(model: str, smoke: bool) -> dict[str, Any]:
    return (SMOKE_MODELS if smoke else MODELS)[model]


def config_values(model: str, smoke: bool) -> dict[str, Any]:
    """The TrainConfig fields of a workload (the transformer is built here, so the config names a
    built-in model it never builds)."""
    spec = spec_of(model, smoke)
    if spec["model"] == "transformer":
        return {"model": "mlp", "batch_size": spec["batch_size"], "synthetic_shape": "1"}
    return {key: value for key, value in spec.items() if key not in OWN_KEYS}


def narrow_resnet(model: str, smoke: bool) -> int | None:
    """The smoke size's ResNet-18 width, or None for the real model (built through hvdtrain's build_model)."""
    return spec_of(model, smoke).get("width")


def is_tokens(model: str) -> bool:
    return MODELS[model]["model"] == "transformer"


class TokenData(Dataset):
    """Random token sequences labelled by a fixed rule (token-sum buckets): learnable, dict items."""

    def __init__(self, samples: int, vocab: int, seq: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (samples, seq), generator=gen)
        self.labels = (self.tokens.sum(dim=1) * NUM_CLASSES // (vocab * seq)).clamp(max=NUM_CLASSES - 1)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.tokens[index], "label": self.labels[index]}


class Encoder(nn.Module):
    """Token + position embeddings, a pre-norm TransformerEncoder, mean pooling, a linear head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int, ff: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, NUM_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(dim=1))


def token_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """hvdtrain's step_fn for dict batches (and the hand-written loops' step for them)."""
    return nn.functional.cross_entropy(model(batch["tokens"]), batch["label"])


def token_workload(model: str, smoke: bool, samples: int, seed: int) -> tuple[nn.Module, TokenData, TokenData]:
    spec = spec_of(model, smoke)
    kwargs = {key: spec[key] for key in TOKEN_KEYS}
    val = max(spec["batch_size"], samples // 20)
    return (Encoder(**kwargs), TokenData(samples, spec["vocab"], spec["seq"], seed),
            TokenData(val, spec["vocab"], spec["seq"], seed + 1))
