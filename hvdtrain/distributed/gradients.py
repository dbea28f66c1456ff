"""Horovod's DistributedOptimizer, wrapped and synchronised the way the loop needs."""
from __future__ import annotations

from typing import Any

import torch

from hvdtrain.distributed import wire
from hvdtrain.distributed.runtime import hvd
from hvdtrain.distributed.wait import wait_quietly
from hvdtrain.errors import UserError


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *, accumulate: int = 1,
                   compression: str = "none", op: str = "average",
                   gradient_predivide_factor: float = 1.0) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer: gradients are averaged (or Adasum-combined) as backward produces them.

    accumulate: backward passes per step; the allreduce starts in the last one (gradients add up locally).
    compression: "fp16" sends float gradients as float16 and restores their dtype after the allreduce;
        "none" sends them as they are, except bf16 ones, as float32 (Horovod 0.28.1 has no bfloat16).
    """
    if op == "adasum" and hvd.size() > 1 and not hvd.mpi_enabled():
        raise UserError("op adasum needs Horovod's MPI operations (Gloo has no Adasum): launch with "
                        "horovodrun --mpi, or use --op average")
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if compression == "fp16" else wire.Bf16AsFp32,
        backward_passes_per_step=accumulate, op=hvd.Adasum if op == "adasum" else hvd.Average,
        gradient_predivide_factor=gradient_predivide_factor)


def steps_in_backward(op: str) -> bool:
    """Adasum with several workers applies each tensor's update inside backward, then combines the deltas."""
    return op == "adasum" and hvd.size() > 1


def synchronize_gradients(optimizer: Any) -> None:
    """DistributedOptimizer.synchronize(), after sleeping until this step's gradient allreduces are done."""
    # Horovod's wrapper keeps {param or group: (handle, ctx)}; a None or callable handle is not an op in flight.
    in_flight = getattr(optimizer, "_handles", {}).values()
    wait_quietly(handle for handle, _ in in_flight if isinstance(handle, int))
    optimizer.synchronize()
