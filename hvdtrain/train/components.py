"""What the Trainer builds from its config: device, optimizer, precision, progress bar (no Horovod import)."""
from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("device cuda was asked for but torch sees no CUDA device; use --device cpu")
    # Horovod: one GPU per worker, chosen by its rank on this host.
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    kind = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return kind(params, lr=config.lr, weight_decay=config.weight_decay)


def show_progress() -> bool:
    """A bar only where someone watches: a terminal or a notebook, never a log file."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    """fp16 needs a loss scaler and float16 kernels: a CUDA device."""
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"precision fp16 needs a CUDA device (this worker runs on {device.type}); "
                        "on CPU use --precision bf16")


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """Forward and loss in bf16/fp16 where safe (matmul, conv); reductions and the loss stay float32.

    Parameters, gradients and the optimizer stay float32, so the allreduce sees float32 gradients
    (unless --compression fp16).
    """
    if precision not in _DTYPES:
        return nullcontext()  # a disabled torch.autocast still costs ~15 us per step
    return torch.autocast(device.type, dtype=_DTYPES[precision])


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 only: float16 gradients underflow without loss scaling; bf16 has float32's range."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None
