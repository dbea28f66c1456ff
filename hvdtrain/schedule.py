"""Learning-rate scaling and warmup: pure functions of the number of workers and the step."""
from __future__ import annotations

import math


def scaled_lr(base_lr: float, size: int, policy: str) -> float:
    """The LR for `size` workers: Goyal et al.'s linear rule, or the gentler square root."""
    factor = {"none": 1.0, "linear": float(size), "sqrt": math.sqrt(size)}[policy]
    return base_lr * factor


def lr_at(step: int, base_lr: float, target_lr: float, warmup_steps: int) -> float:
    """Linear ramp from base_lr (one worker's LR) to target_lr over warmup_steps, then constant."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps
