"""Mixed precision: autocast for the forward pass, a loss scaler for fp16."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from hvdtrain.errors import UserError

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
