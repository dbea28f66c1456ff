"""Horovod's DistributedOptimizer, wrapped and synchronised the way the loop needs."""
from __future__ import annotations

from typing import Any

import torch

from hvdtrain.distributed import wire
from hvdtrain.distributed.runtime import hvd, native_bf16
from hvdtrain.distributed.wait import wait_quietly
from hvdtrain.errors import UserError


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *, accumulate: int = 1,
                   compression: str = "none", op: str = "average",
                   gradient_predivide_factor: float = 1.0) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer: gradients are averaged (or Adasum-combined) as backward produces them.

    accumulate: backward passes per step; the allreduce starts in the last one (gradients add up locally).
    compression: "fp16" / "bf16" send float gradients as float16 / bfloat16 and restore their dtype after the
        allreduce; "none" sends them as they are (bf16 ones as float32 where Horovod lacks bfloat16).
    """
    if op == "adasum" and hvd.size() > 1 and not hvd.mpi_enabled():
        raise UserError("op adasum needs Horovod's MPI operations (Gloo has no Adasum): launch with "
                        "horovodrun --mpi, or use --op average")
    if compression == "bf16" and not native_bf16():
        raise UserError("compression bf16 needs bfloat16 in Horovod, and this Horovod was built without "
                        "hvdtrain's bfloat16 patch (an older cached wheel): re-run `make setup` (or "
                        "scripts/install-horovod), or use --compression fp16")
    compressor = {"fp16": hvd.Compression.fp16, "bf16": wire.Bf16Compressor}.get(compression, wire.no_compression())
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compressor,
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
