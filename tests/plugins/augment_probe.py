"""Test plug-ins for resumed augmentations: synthetic data with a random draw added to every sample as it is
loaded (an 'augmentation', made in a loader worker when there are workers), and an MLP that keeps the inputs
of every training step it runs (TRAINED, in this process), so a test compares what was trained exactly."""
import torch
from torch import nn
from torch.utils.data import Dataset

from hvdtrain.data.datasets import Data, synthetic
from hvdtrain.models.builtin import mlp

TRAINED: list[torch.Tensor] = []


class Jittered(Dataset):
    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        inputs, target = self.inner[index]
        return inputs + torch.rand(inputs.shape), target


def jittered_synthetic(config):
    data = synthetic(config)
    return Data(Jittered(data.train), data.val, data.num_classes)


class _Recording(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            TRAINED.append(x.detach().clone())
        return self.inner(x)


def recording_mlp(config, input_shape, num_classes):
    return _Recording(mlp(config, input_shape, num_classes))
