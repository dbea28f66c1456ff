"""One training or evaluation step on one batch: the default `loss_fn(model(inputs), targets)` for
(inputs, targets) pairs; `model(**batch).loss` for dict batches (a model that computes its own loss, the
Hugging Face convention); or the user's `step_fn(model, batch)` for everything else (several inputs
or losses, extra values to report).

    step_fn(model, batch) -> loss                          # a scalar tensor, mean over the batch
    step_fn(model, batch) -> (loss, {"name": value, ...})  # plus batch means to report as metrics

Example:
    >>> def step(model, batch):                 # a Hugging Face-style model that returns its own loss
    ...     out = model(**batch)
    ...     return out.loss, {"aux": out.aux_loss}
    >>> hvdtrain.Trainer(model, train, val, step_fn=step)
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hvdtrain.errors import UserError, first_line
from hvdtrain.train.batch import batch_len, describe, first_tensor

StepResult = torch.Tensor | tuple[torch.Tensor, dict[str, Any]]
StepFn = Callable[[nn.Module, Any], StepResult]
LossFn = Callable[[Any, Any], torch.Tensor]
HOOK_HINT = ("pass step_fn=lambda model, batch: ... returning the loss (or (loss, {'name': value})); "
             "see docs/your-model.md#from-python-any-batch-any-output-your-own-step")


@dataclass
class StepOut:
    loss: torch.Tensor
    n: int                              # samples in the batch
    outputs: torch.Tensor | None = None  # the default step's (first) output tensor, for metrics
    targets: Any = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MSE of outputs shaped like the targets ([B, 1] outputs for [B] targets)."""
    if outputs.numel() == targets.numel():
        outputs = outputs.reshape(targets.shape)
    return nn.functional.mse_loss(outputs, targets)


def default_loss(choice: str, batch: Any) -> LossFn:
    """--loss: cross_entropy, mse, or auto (MSE when the targets of (inputs, targets) batches are real numbers)."""
    if choice == "auto":
        targets = batch[1] if isinstance(batch, (list, tuple)) and len(batch) == 2 else None
        choice = "mse" if isinstance(targets, torch.Tensor) and targets.is_floating_point() else "cross_entropy"
    return mse if choice == "mse" else nn.functional.cross_entropy


LABEL_KEYS = ("labels", "label")


def _forward_takes(kind: Any, name: str) -> bool:
    return name in _forward_params(kind) or "**" in _forward_params(kind)


@functools.cache
def _forward_params(kind: Any) -> frozenset[str]:
    """The keyword names `kind.forward` takes ("**" when it takes any); once per model class, not per step."""
    params = inspect.signature(kind.forward).parameters.values()
    return frozenset("**" if p.kind is p.VAR_KEYWORD else p.name for p in params)


def model_inputs(model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch as keyword arguments; a `label` column goes in as `labels` when that is what forward takes
    (Hugging Face datasets name it `label`, its models take `labels`)."""
    kwargs = dict(batch)
    if "label" in kwargs and "labels" not in kwargs and not _forward_takes(type(model), "label") \
            and _forward_takes(type(model), "labels"):
        kwargs["labels"] = kwargs.pop("label")
    return kwargs


def output_field(out: Any, name: str) -> Any:
    """`out.name` or `out[name]` (Hugging Face ModelOutput, dict, or any object), None when absent."""
    if isinstance(out, Mapping):
        return out.get(name)
    return getattr(out, name, None)


def run_step(model: nn.Module, batch: Any, loss_fn: LossFn, step_fn: StepFn | None) -> StepOut:
    """Forward and loss for one batch already on the device (backward is the caller's)."""
    if step_fn is not None:
        result = step_fn(model, batch)
        loss, extras = result if isinstance(result, tuple) else (result, {})
        return StepOut(loss, batch_len(batch), extras=extras)
    if isinstance(batch, Mapping):              # the model computes its own loss from the batch's labels
        out = model(**model_inputs(model, batch))
        targets = next((batch[key] for key in LABEL_KEYS if key in batch), None)
        logits = output_field(out, "logits")
        return StepOut(output_field(out, "loss"), batch_len(batch),
                       logits if isinstance(logits, torch.Tensor) else None, targets)
    inputs, targets = batch
    outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    n = targets.shape[0] if isinstance(targets, torch.Tensor) and targets.dim() else batch_len(inputs)
    return StepOut(loss, n, first_tensor(outputs), targets)


def check_step(model: nn.Module, batch: Any, loss_fn: LossFn, step_fn: StepFn | None) -> StepOut:
    """Run one step and explain, in one line, whatever keeps this batch from training.

    Called once before training on a small batch of the training data, so that an unsupported
    batch or output is a UserError naming the batch's type and the hook to use, on every rank
    alike, instead of a traceback from deep inside the loop.
    """
    what = describe(batch)
    # A dict batch is for model(**batch) only when forward takes its keys; anything else is ambiguous.
    mapping = isinstance(batch, Mapping) and all(_forward_takes(type(model), key) for key in model_inputs(model, batch))
    if step_fn is None and not mapping and not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        raise UserError(f"the default step takes (inputs, targets) pairs, but a batch is {what}; {HOOK_HINT}")
    try:
        out = run_step(model, batch, loss_fn, step_fn)
    except UserError:
        raise
    except Exception as err:
        if step_fn is None:
            labels_in_range(model, batch)       # the usual cause, named with both numbers
        where = "step_fn" if step_fn is not None else "model(**batch)" if mapping else "loss_fn(model(inputs), targets)"
        first = first_line(err)
        error = first if first == type(err).__name__ else f"{type(err).__name__}: {first}"
        raise UserError(f"{where} failed on a batch of {what}: {error}"
                        + ("" if step_fn is not None else f"; {HOOK_HINT}")) from None
    if step_fn is None and mapping and out.loss is None:
        raise UserError(f"model(**batch) returned no loss for a batch of {what} (a model computes its own loss "
                        f"only when the batch holds its labels: a 'labels' or 'label' key); {HOOK_HINT}")
    if not (isinstance(out.loss, torch.Tensor) and out.loss.numel() == 1 and out.loss.is_floating_point()):
        got = describe(out.loss)
        raise UserError(f"the loss must be a scalar float tensor (mean over the batch), got {got}; "
                        + ("return it from step_fn" if step_fn is not None else "check loss_fn, or " + HOOK_HINT))
    for name, value in out.extras.items():
        if not isinstance(name, str) or torch.as_tensor(value).numel() != 1:
            raise UserError(f"step_fn's metrics must be {{'name': scalar}}, got {name!r}: {describe(value)}")
    return out


def _outputs_and_labels(model: nn.Module, batch: Any) -> tuple[Any, Any]:
    """The model's class scores and the batch's class labels, for a check outside the loop."""
    if isinstance(batch, Mapping):
        inputs = {k: v for k, v in model_inputs(model, batch).items() if k not in LABEL_KEYS}
        return output_field(model(**inputs), "logits"), next((batch[k] for k in LABEL_KEYS if k in batch), None)
    return first_tensor(model(batch[0])), batch[1]


def labels_in_range(model: nn.Module, batch: Any) -> None:
    """UserError when class labels reach past the model's outputs (cross-entropy's own message is an index
    error deep in torch); silent when the batch holds no class labels or the forward itself fails."""
    if not isinstance(batch, Mapping) and not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        return
    try:
        outputs, targets = _outputs_and_labels(model, batch)
    except Exception:
        return                                  # the caller's message says how the forward fails
    if not (isinstance(targets, torch.Tensor) and targets.numel() and not targets.is_floating_point()
            and isinstance(outputs, torch.Tensor) and outputs.dim() >= 2):
        return
    classes, top = outputs.shape[-1], int(targets.max())
    if top >= classes:
        raise UserError(f"labels go up to {top}, but the model outputs {classes} classes (labels must be "
                        f"0..{classes - 1}): build the model with at least {top + 1} outputs (num_classes), "
                        f"or map the labels to 0..{classes - 1}")
