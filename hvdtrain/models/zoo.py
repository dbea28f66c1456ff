"""Models by name from the model zoos: `torchvision:resnet18`, `timm:resnet18` (random init; the
classifier sized from the data). Plus a ResNet-18 of our own (`resnet18`) for machines without
torchvision: on CPU-only torch 2.13 the torchvision wheels on PyPI are CUDA builds that do not import.
"""
from __future__ import annotations

import torch
from torch import nn

from hvdtrain.errors import UserError, first_line

ZOOS = ("torchvision", "timm")


def from_zoo(spec: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """`torchvision:NAME` or `timm:NAME` -> that architecture with `num_classes` outputs."""
    zoo, _, name = spec.partition(":")
    if len(input_shape) != 3:
        raise UserError(f"model {spec} takes images (channels, height, width); the data gives {input_shape}")
    try:
        if zoo == "torchvision":
            import torchvision

            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
        else:
            import timm

            model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=input_shape[0])
    except ImportError as err:
        raise UserError(f"model {spec} needs {zoo}, which does not import here ({first_line(err, 120)}); "
                        f"install the {zoo} build that matches your torch, or use --model resnet18 "
                        "(hvdtrain's own)") from None
    except (ValueError, KeyError, RuntimeError) as err:
        raise UserError(f"{zoo} has no model '{name}' ({first_line(err, 120)})") from None
    if zoo == "torchvision" and input_shape[0] != 3:
        raise UserError(f"torchvision models take 3-channel images; the data has {input_shape[0]} channel(s): "
                        "use timm:NAME (in_chans) or convert the images to RGB")
    return model


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet18(channels: int, num_classes: int, width: int = 64) -> nn.Module:
    """ResNet-18 (He et al. 2015; torchvision's layout: 2 basic blocks per stage, 64-512 channels).

    width: the first stage's channels (64 is ResNet-18; smaller is the same graph, cheaper: tests)."""
    layers: list[nn.Module] = [nn.Conv2d(channels, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for cout, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, num_classes)]
    return nn.Sequential(*layers)
