"""One training or evaluation step on one batch: the default `loss_fn(model(inputs), targets)`, or the
user's `step_fn(model, batch)` for everything that cannot express (models that compute their own loss,
dict batches, several inputs or losses).

    step_fn(model, batch) -> loss                          # a scalar tensor, mean over the batch
    step_fn(model, batch) -> (loss, {"name": value, ...})  # plus batch means to report as metrics

Example:
    >>> def step(model, batch):                 # a Hugging Face-style model that returns its own loss
    ...     out = model(**batch)
    ...     return out.loss, {"aux": out.aux_loss}
    >>> hvdtrain.Trainer(model, train, val, step_fn=step)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hvdtrain.errors import UserError
from hvdtrain.train.batch import batch_len, describe, first_tensor

StepResult = torch.Tensor | tuple[torch.Tensor, dict[str, Any]]
StepFn = Callable[[nn.Module, Any], StepResult]
LossFn = Callable[[Any, Any], torch.Tensor]
HOOK_HINT = ("pass step_fn=lambda model, batch: ... returning the loss (or (loss, {'name': value})); "
             "see README 'Your own model and data'")


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


def run_step(model: nn.Module, batch: Any, loss_fn: LossFn, step_fn: StepFn | None) -> StepOut:
    """Forward and loss for one batch already on the device (backward is the caller's)."""
    if step_fn is not None:
        result = step_fn(model, batch)
        loss, extras = result if isinstance(result, tuple) else (result, {})
        return StepOut(loss, batch_len(batch), extras=extras)
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
    if step_fn is None and not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        raise UserError(f"the default step takes (inputs, targets) pairs, but a batch is {what}; {HOOK_HINT}")
    try:
        out = run_step(model, batch, loss_fn, step_fn)
    except UserError:
        raise
    except Exception as err:
        where = "step_fn" if step_fn is not None else "loss_fn(model(inputs), targets)"
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{where} failed on a batch of {what}: {type(err).__name__}: {first}"
                        + ("" if step_fn is not None else f"; {HOOK_HINT}")) from None
    if not (isinstance(out.loss, torch.Tensor) and out.loss.numel() == 1 and out.loss.is_floating_point()):
        got = describe(out.loss)
        raise UserError(f"the loss must be a scalar float tensor (mean over the batch), got {got}; "
                        + ("return it from step_fn" if step_fn is not None else "check loss_fn, or " + HOOK_HINT))
    for name, value in out.extras.items():
        if not isinstance(name, str) or torch.as_tensor(value).numel() != 1:
            raise UserError(f"step_fn's metrics must be {{'name': scalar}}, got {name!r}: {describe(value)}")
    return out
