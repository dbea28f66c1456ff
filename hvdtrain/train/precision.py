"""Mixed precision: autocast for the forward pass, a loss scaler for fp16."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from hvdtrain.config.train_config import TrainConfig
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


@dataclass(frozen=True)
class PrecisionSettings:
    """What the precision component reads of the config."""

    precision: str          # fp32, bf16 or fp16

    @classmethod
    def of(cls, config: TrainConfig) -> PrecisionSettings:
        return cls(config.precision)


class Precision:
    """Autocast for the forward pass and, with fp16, the loss scaler, whose scale is its state (checkpointed)."""

    def __init__(self, settings: PrecisionSettings, device: torch.device) -> None:
        check_precision(settings.precision, device)
        self.settings, self.device = settings, device
        self.scaler = make_scaler(settings.precision, device)

    def autocast(self) -> AbstractContextManager:
        return autocast(self.settings.precision, self.device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward() on: scaled with fp16, so small gradients do not underflow."""
        return self.scaler.scale(loss) if self.scaler else loss

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
