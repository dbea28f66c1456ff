"""Rank-side: a model whose weights are bfloat16 (what HF's torch_dtype=torch.bfloat16 gives) through the Trainer.

    python tests/ranks/bf16_weights.py OUT.pt mlp|bn --key value ...   (the rest: TrainConfig overrides)

Rank 0 writes the final weights to OUT.pt and {"digests", "history"} to OUT.json. Horovod 0.28.1 has no
bfloat16: without hvdtrain's float32 wire this ends in "Tensor type torch.BFloat16Tensor is not supported."
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

import hvdtrain
from hvdtrain.data.datasets import build_data
from hvdtrain.distributed import runtime


class Bf16Net(nn.Module):
    """Flat inputs cast to the weights' dtype, as a model whose weights were loaded in bf16 must do."""

    def __init__(self, features: int, classes: int, batch_norm: bool) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(features, 32),
                                    nn.BatchNorm1d(32) if batch_norm else nn.Identity(), nn.ReLU(),
                                    nn.Linear(32, classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs.to(torch.bfloat16))


out, mode, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
config = hvdtrain.load_config(overrides=overrides)
data = build_data(config)
torch.manual_seed(config.seed)
model = Bf16Net(data.train[0][0].numel(), data.num_classes, batch_norm=mode == "bn").to(torch.bfloat16)
trainer = hvdtrain.Trainer(model, data.train, data.val, config=config)
history = trainer.fit()
if runtime.world().is_root:
    assert all(t.dtype == torch.bfloat16 for t in trainer.model.state_dict().values() if t.is_floating_point())
    torch.save(trainer.model.state_dict(), out)
    out.with_suffix(".json").write_text(json.dumps({"digests": history.summary["param_digests"],
                                                    "history": list(history)}))
