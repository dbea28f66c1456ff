"""Built-in models. Model code never imports Horovod.

A model builder, built-in or plug-in, is `build(config, input_shape, num_classes) -> nn.Module`. A run records
config.yaml for a model build_model returned, and model.json (models/recipe.py) for any other: `recipe_for`.
"""
from __future__ import annotations

import math
import weakref

from torch import nn

from hvdtrain.config.plugins import resolve
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError
from hvdtrain.models.recipe import ModelRecipe, describe
from hvdtrain.models.zoo import ZOOS, from_zoo, resnet18
from hvdtrain.output.plain_weights import plain


def mlp(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width = config.hidden
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, num_classes),
    )


def cnn(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise UserError(f"model cnn needs (channels, height, width) inputs, got shape {input_shape}; "
                        "use --model mlp")
    return nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        # Any input size ends as 4x4, so one model serves 8x8 digits and 28x28 synthetic images.
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(64 * 16, config.hidden), nn.ReLU(),
        nn.Linear(config.hidden, num_classes),
    )


def resnet(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise UserError(f"model resnet18 needs (channels, height, width) inputs, got shape {input_shape}; "
                        "use --model mlp")
    return resnet18(input_shape[0], num_classes)


BUILTIN = {"mlp": mlp, "cnn": cnn, "resnet18": resnet}


# Models build_model returned, and the spec each was built from: a run records its config.yaml for these and a
# model.json (models/recipe.py) for any other. Weak: a model is forgotten with its last reference; a copy is not it.
_BUILT: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def build_model(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model named by config.model: a built-in, `torchvision:NAME` / `timm:NAME`, or a plug-in."""
    if config.model.partition(":")[0] in ZOOS:
        model = from_zoo(config.model, input_shape, num_classes)
    else:
        builder = resolve(config.model, "model", BUILTIN)
        if _is_model_class(builder):
            raise UserError(f"model {config.model} is a model class, not a builder: --model takes a function "
                            "(config, input_shape, num_classes) that returns the model (a run of a model class "
                            "keeps its constructor arguments in model.json beside config.yaml)")
        model = builder(config, input_shape, num_classes)
    if not isinstance(model, nn.Module):
        raise UserError(f"model builder {config.model} must return a torch.nn.Module, "
                        f"got {type(model).__name__}")
    _BUILT[model] = config.model
    return model


def _is_model_class(found: object) -> bool:
    return isinstance(found, type) and issubclass(found, nn.Module)


def recipe_for(model: nn.Module, config: TrainConfig) -> ModelRecipe | None:
    """What a run of `config` training `model` records in model.json: None when the model was built from
    config.model (config.yaml rebuilds it) or the run writes no folder."""
    model = plain(model)
    if not config.run_dir or _BUILT.get(model) == config.model:
        return None
    return describe(model)
