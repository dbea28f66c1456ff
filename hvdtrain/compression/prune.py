"""Structured pruning: whole channels and neurons are removed, so the model gets smaller and faster.

(`torch.nn.utils.prune` only masks weights: no size or speed gain until structure is removed.)
Works on nn.Sequential models of Conv2d / Linear layers with element-wise layers, pooling, BatchNorm
and Flatten between them, like the built-in mlp and cnn. Channels with the smallest L1 norm go.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from hvdtrain.compression import measure
from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.compression.outcome import Outcome, follow_up_config, say
from hvdtrain.errors import UserError
from hvdtrain.trained.finished_run import FinishedRun

# Layers that keep a channel's identity (they act per channel or per element).
_PASS_THROUGH = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity,
                 nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d)


def compress(run: FinishedRun, opts: CompressOptions) -> Outcome:
    """Prune the run's model, then fine-tune it with the normal Trainer on every Horovod worker."""
    from hvdtrain.train.trainer import Trainer  # Horovod only once a method trains

    pruned, lines = prune_channels(run.model, opts.sparsity)
    before = measure.accuracy(pruned, run.data.val)
    epochs = opts.epochs or 3
    config = follow_up_config(run.config, epochs=epochs, lr=opts.lr or run.config.lr, warmup_epochs=0)
    say(opts, f"pruned {', '.join(lines)}; held-out accuracy before fine-tuning {before:.4f}; "
              f"fine-tuning {epochs} epoch(s)")
    with Trainer(pruned, run.data.train, run.data.val, config=config) as trainer:   # gives the run folder back
        history = trainer.fit()
    details = {"sparsity": opts.sparsity, "pruned_layers": lines, "val_acc_before_finetune": before,
               "finetune": {"epochs": epochs, "lr": config.lr, "workers": history.summary.get("workers"),
                            "val_acc": [r.get("val_acc") for r in history],
                            "wall_time_s": history.summary.get("wall_time_s")}}
    # The Trainer may have moved it to a GPU: export and latency timing run on CPU inputs.
    return Outcome(f"pruned {opts.sparsity:.0%}", pruned.cpu().eval(), run.config, details)


def check_prunable(model: nn.Module) -> None:
    """UserError unless `prune_channels` can shrink this model (checked before anything is written)."""
    if not isinstance(model, nn.Sequential):
        raise UserError(f"prune works on nn.Sequential models (like the built-in mlp and cnn); this model is a "
                        f"{type(model).__name__}: use --method int8 or distill")
    weights = 0
    for index, layer in enumerate(model):
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            weights += 1
            if isinstance(layer, nn.Conv2d) and layer.groups != 1:
                raise UserError(f"prune: layer {index} is a grouped convolution (groups={layer.groups}); "
                                "only groups=1 is supported")
        elif not isinstance(layer, (*_PASS_THROUGH, *_BATCH_NORM, nn.Flatten)):
            raise UserError(f"prune: layer {index} ({type(layer).__name__}) is not supported; supported: Conv2d, "
                            "Linear, BatchNorm, Flatten, pooling and element-wise activations")
    if weights < 2:
        raise UserError("prune needs at least two Conv2d/Linear layers (the last one's outputs are the classes)")


def _keep(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Indices (ascending) of the output channels with the largest L1 norm."""
    count = weight.shape[0]
    keep = max(1, round(count * (1.0 - sparsity)))
    return weight.detach().abs().flatten(1).sum(1).topk(keep).indices.sort().values


def _shrink_out(layer: Any, index: torch.Tensor) -> None:
    layer.weight = nn.Parameter(layer.weight.detach()[index].clone())
    if getattr(layer, "bias", None) is not None:
        layer.bias = nn.Parameter(layer.bias.detach()[index].clone())
    if isinstance(layer, nn.Conv2d):
        layer.out_channels = len(index)
    elif isinstance(layer, nn.Linear):
        layer.out_features = len(index)
    else:  # BatchNorm
        layer.num_features = len(index)
        layer.running_mean = layer.running_mean[index].clone()
        layer.running_var = layer.running_var[index].clone()


def _shrink_in(layer: Any, index: torch.Tensor) -> None:
    layer.weight = nn.Parameter(layer.weight.detach()[:, index].clone())
    if isinstance(layer, nn.Conv2d):
        layer.in_channels = len(index)
    else:
        layer.in_features = len(index)


def prune_channels(model: nn.Module, sparsity: float) -> tuple[nn.Sequential, list[str]]:
    """A copy of `model` with `sparsity` of every hidden layer's channels/neurons removed.

    Args:
        model: a trained nn.Sequential (see check_prunable); the last Conv2d/Linear keeps all outputs.
        sparsity: share of channels removed per layer, 0 < sparsity < 1.
    Returns:
        The smaller model (fine-tune it) and one line per pruned layer, e.g. "1: Conv2d 32 -> 16 channels".
    Example:
        >>> small, lines = prune_channels(trained_cnn, 0.5)
    """
    check_prunable(model)
    pruned = copy.deepcopy(model)
    assert isinstance(pruned, nn.Sequential)  # checked above
    layers: list[Any] = list(pruned)
    weight_at = [i for i, layer in enumerate(layers) if isinstance(layer, (nn.Conv2d, nn.Linear))]
    lines = []
    for producer, consumer in zip(weight_at, weight_at[1:], strict=False):
        layer = layers[producer]
        index = _keep(layer.weight, sparsity)
        before = layer.weight.shape[0]
        _shrink_out(layer, index)
        unit = "channels" if isinstance(layer, nn.Conv2d) else "neurons"
        lines.append(f"{producer}: {type(layer).__name__} {before} -> {len(index)} {unit}")
        for between in layers[producer + 1:consumer]:
            if isinstance(between, _BATCH_NORM):
                _shrink_out(between, index)
            elif isinstance(between, nn.Flatten):
                # Channel c became features c*k ... c*k+k-1 (k = its spatial positions).
                target = layers[consumer]
                inputs = target.weight.shape[1]
                if not isinstance(target, nn.Linear) or inputs % before:
                    raise UserError(f"prune: cannot map the {before} channels of layer {producer} through Flatten "
                                    f"to layer {consumer}'s {inputs} inputs")
                span = inputs // before
                index = (index[:, None] * span + torch.arange(span)).flatten()
        _shrink_in(layers[consumer], index)
    return pruned, lines
