"""Learning-rate scaling, warmup and decay: pure functions of the number of workers and the step."""
from __future__ import annotations

import math
from typing import Any


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


def schedule_steps(fit_step: int, position: int, epochs_left: int, steps_per_epoch: int, global_batch: int,
                   steps_left: int | None = None) -> int:
    """The step the LR schedule ends at: this fit's steps so far, plus the rest of the current epoch (`position`
    samples of it trained, `global_batch` samples a step) and `epochs_left` - 1 more, or `steps_left` if fewer.
    Planned at every (re)start: after an elastic reset the same epochs take a different number of steps."""
    todo = epochs_left * steps_per_epoch - -(-position // global_batch)
    return fit_step + (min(todo, steps_left) if steps_left is not None else todo)


def set_lrs(optimizer: Any, base_lrs: list[float], factor: float) -> None:
    """Every param group's LR: its one-worker LR (as the user built it) times this step's factor."""
    for group, base_lr in zip(optimizer.param_groups, base_lrs, strict=True):
        group["lr"] = base_lr * factor
