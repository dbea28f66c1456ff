"""Steps whose loss or gradients are not finite: skipped on every rank alike, fatal after too many in a row."""
from __future__ import annotations

import torch
from torch import nn

from hvdtrain.errors import UserError
from hvdtrain.train.progress import Progress


def count_nonfinite(p: Progress, finite: bool, what: str, limit: int) -> bool:
    """Count a non-finite step (the verdict is the same on every rank); abort after `limit` in a row.

    Returns:
        True when the step may be applied.
    """
    if finite:
        p.nonfinite = 0
        return True
    p.skipped += 1
    p.nonfinite += 1
    if p.nonfinite >= limit:
        verb = "was" if what == "loss" else "were"
        raise UserError(f"the {what} {verb} not finite for {limit} steps in a row (step {p.step + 1}, "
                        f"epoch {p.epoch + 1}); lower --lr, check the data for NaN/inf, or raise --nonfinite-limit")
    return False


def gradients_finite(model: nn.Module, scaler: torch.amp.GradScaler | None, p: Progress, limit: int) -> bool:
    """fp16: the unscaled gradients decide (an overflow leaves the loss finite). They are identical on
    every rank after the allreduce, so every rank reaches the same verdict."""
    if not limit:
        return True
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    # A tensor is finite iff its min and max are (NaN propagates through both): one read pass.
    extremes = [v for g in grads if g.numel() for v in torch.aminmax(g)]
    # With --stages K the gradients live on K GPUs: gather the 2 values per tensor on one device to stack them.
    finite = not extremes or bool(torch.isfinite(torch.stack([v.to(extremes[0].device) for v in extremes])).all())
    if not finite and scaler is not None and scaler.get_scale() >= 1.0:
        p.skipped += 1
        return False  # fp16 overflow at a large loss scale: routine, the scaler halves the scale
    return count_nonfinite(p, finite, "gradients", limit)
