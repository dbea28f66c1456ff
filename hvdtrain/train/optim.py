"""The optimizer a config asks for (before Horovod wraps it)."""
from __future__ import annotations

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    kind = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return kind(params, lr=config.lr, weight_decay=config.weight_decay)
