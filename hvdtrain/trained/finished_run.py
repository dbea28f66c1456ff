"""A finished run read back: its config, its model rebuilt with the trained weights, and its data.

The one reader for what comes after training: `hvdtrain predict`, `hvdtrain compress` and tuning's
best.yaml. A run directory holds config.yaml and model.pt (written by training); a checkpoint
(checkpoints/ckpt-STEP.pt) carries its own config. The model is rebuilt from, in this order: a builder the
caller names (`--model module:function`), the run's model.json (a Trainer given the user's own model writes
it: models/recipe.py), or the config's `model`. Weights load strictly, so a rebuilt model that differs from
the trained one is an error, never a silently different architecture. Every problem is a one-line UserError.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data.datasets import Data, build_data, input_shape
from hvdtrain.errors import UserError, first_line
from hvdtrain.models import recipe
from hvdtrain.models.builtin import build_model
from hvdtrain.output.plain_weights import load_plain_state


@dataclass
class FinishedRun:
    """A trained model with the config and data it was trained on (the same split, the same seed)."""
    path: Path                  # the run directory
    weights_file: Path          # model.pt or the checkpoint the weights came from
    config: TrainConfig
    model: nn.Module            # in eval mode
    data: Data
    input_shape: tuple[int, ...]  # of one sample
    model_record: recipe.ModelRecipe | None = None   # model.json's record, when the model was rebuilt from it

    @property
    def model_bytes(self) -> int:
        return self.weights_file.stat().st_size


def read_config(path: str | Path, /, **changes: Any) -> TrainConfig:
    """The config a run trained with (PATH/config.yaml), with keyword `changes` (e.g. run_dir=) applied."""
    config_file = Path(path) / "config.yaml"
    if not config_file.is_file():
        raise UserError(f"{path} has no config.yaml: a finished run directory has one (training and compress "
                        "write it)")
    return load_config(str(config_file), **changes)


def weights_file(path: str | Path) -> Path:
    """The weights of a run directory (its model.pt), or `path` itself when it names a file."""
    path = Path(path)
    if path.is_dir():
        if not (path / "model.pt").is_file():
            raise UserError(f"{path} has no model.pt (a finished training run writes it)")
        return path / "model.pt"
    if not path.exists() and not path.suffix:
        raise UserError(f"run directory {path} does not exist")
    return path


def read_trained(path: str | Path) -> tuple[dict[str, torch.Tensor], TrainConfig, Path]:
    """The weights and training config of a run directory, a model.pt (config.yaml beside it) or a checkpoint.

    Returns:
        (state_dict, config, the weights file read).
    Raises:
        UserError: the path, its weights or its config is missing or unreadable.
    """
    file = weights_file(path)
    state, saved_config = checkpoint.read_weights(file)
    if saved_config is not None:
        return state, load_config(**saved_config), file
    if not (file.parent / "config.yaml").is_file():
        raise UserError(f"{file} holds weights only and there is no {file.parent / 'config.yaml'} to rebuild the "
                        "model from")
    return state, read_config(file.parent), file


def run_dir_of(weights: Path) -> Path:
    """The run directory a weights file belongs to (a checkpoint's is the folder above checkpoints/)."""
    return weights.parent.parent if weights.parent.name == "checkpoints" else weights.parent


def model_recipe(weights: Path) -> recipe.ModelRecipe | None:
    """The model.json of the run `weights` belongs to: how to rebuild a model not built from the config."""
    return recipe.read(run_dir_of(weights))


def rebuild(config: TrainConfig, state: dict[str, torch.Tensor], data: Data, weights: Path | str = "",
            model_record: recipe.ModelRecipe | None = None) -> nn.Module:
    """The model of `model_record` (model.json), else of `config`, for `data`, with the trained `state` loaded,
    in eval mode.

    Built under the run's seed (a model may draw buffers that no state dict holds) without moving the
    caller's random numbers.
    """
    where = weights or "the weights"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if model_record is not None:
            model = model_record.build(run_dir_of(Path(weights)) if weights else "the run")
        else:
            model = build_model(config, input_shape(data.train), data.num_classes)
    try:
        load_plain_state(model, state)  # older files of compiled models carry `_orig_mod.` in their keys
    except (RuntimeError, TypeError, AttributeError, KeyError) as err:
        if model_record is not None:
            raise UserError(f"{where} does not fit {model_record.call}, rebuilt from model.json: "
                            f"{first_line(err, 160)}; {recipe.FIX}") from None
        raise UserError(f"{where} does not fit the model of its config ({config.model}): "
                        f"{first_line(err, 160)}") from None
    return model.eval()


def read(path: str | Path, **changes: Any) -> FinishedRun:
    """A finished run, rebuilt: `path` is its directory, its model.pt or one of its checkpoints.

    Args:
        path: where the run is.
        **changes: config values to override before the data is built, e.g. dataset="digits"; model=
            "module:function" names a builder for a run whose model.json says hvdtrain cannot rebuild it.
    Raises:
        UserError: no weights or config; a model that cannot be rebuilt (why, and the fix); weights that do
            not fit the rebuilt model.
    Example:
        >>> run = read("runs/mlp-digits")
        >>> run.model(run.data.val[0][0][None]).argmax(1)
    """
    state, config, file = read_trained(path)
    # A builder named by the caller replaces the record; otherwise model.json, checked before the data loads.
    record = None if changes.get("model") else model_recipe(file)
    if record is not None:
        record.check(run_dir_of(file))
    if changes:
        config = load_config(**{**config.to_dict(), **changes})
    data = build_data(config)
    return FinishedRun(run_dir_of(file), file, config, rebuild(config, state, data, file, record), data,
                       input_shape(data.train), record)
