"""Plug-in example: your own model and dataset, used by import path.

    PYTHONPATH=examples horovodrun -np 2 -H localhost:2 python -m hvdtrain \
        --model my_plugins:build_model --dataset my_plugins:build_dataset

A dataset builder takes the config and returns (train, val, num_classes) with torch Datasets of
(input, label) pairs. A model builder takes (config, input_shape, num_classes) and returns an
nn.Module. Neither imports Horovod: the trainer does the distribution.
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset


def build_dataset(config):
    """Two noisy concentric rings: a small problem a linear model cannot solve."""
    gen = torch.Generator().manual_seed(config.seed)
    n = 600
    label = torch.randint(0, 2, (n,), generator=gen)
    angle = torch.rand(n, generator=gen) * 2 * torch.pi
    radius = 0.5 + 0.5 * label + 0.1 * torch.randn(n, generator=gen)
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return TensorDataset(points[:480], label[:480]), TensorDataset(points[480:], label[480:]), 2


def build_model(config, input_shape, num_classes):
    return nn.Sequential(nn.Linear(input_shape[0], 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, num_classes))
