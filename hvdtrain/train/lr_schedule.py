"""Learning-rate scaling, warmup and decay: pure functions of the number of workers and the step."""
from __future__ import annotations

import math


def scaled_lr(base_lr: float, size: int, policy: str) -> float:
    """The LR for `size` workers: Goyal et al.'s linear rule, or the gentler square root."""
    factor = {"none": 1.0, "linear": float(size), "sqrt": math.sqrt(size)}[policy]
    return base_lr * factor


def lr_at(step: int, base_lr: float, target_lr: float, warmup_steps: int, total_steps: int = 0,
          decay: str = "none") -> float:
    """Linear ramp from base_lr (one worker's LR) to target_lr over warmup_steps, then decay.

    cosine: half a cosine from target_lr to 0 at total_steps; step: x0.1 at 1/2 and 3/4 of the way.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr + (target_lr - base_lr) * step / warmup_steps
    if decay == "none" or total_steps <= warmup_steps:
        return target_lr
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if decay == "cosine":
        return target_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return target_lr * 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
