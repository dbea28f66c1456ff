"""Collectives the loop and its tools use: sums, averages, objects, the non-finite vote."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hvdtrain.distributed.runtime import hvd
from hvdtrain.distributed.wait import wait_quietly


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    # Alone, a sum is the tensor: skip Horovod's background-thread round trip (as its own
    # DistributedOptimizer does at size 1).
    return tensor.clone() if hvd.size() == 1 else hvd.allreduce(tensor, op=hvd.Sum, name=name)


def average_buffers(buffers: list[torch.Tensor]) -> None:
    """Average float buffers (BatchNorm running statistics) over the ranks, in place, in one grouped op.

    Without it every rank keeps statistics of its own shard: evaluation would differ by rank and the
    replicas would not be equal at the end.
    """
    if hvd.size() == 1 or not buffers:
        return
    averaged = hvd.grouped_allreduce([b.detach() for b in buffers], op=hvd.Average, name="buffers")
    with torch.no_grad():
        for buffer, value in zip(buffers, averaged, strict=True):
            buffer.copy_(value)


def nonfinite_flag_async(value: torch.Tensor, name: str, gradient_predivide_factor: float = 1.0) -> Any:
    """Start the ranks' agreement on whether `value` (one element) is finite on every rank; all_finite() answers.

    Sent after backward as an fp32 average with DistributedOptimizer's own scale factors, so that
    Horovod fuses it into the step's last gradient allreduce instead of negotiating an op of its own
    (an extra op cost up to ~10% of a communication-bound step; benchmarks/README.md)."""
    if hvd.size() == 1:
        return _Done(value.detach())    # one rank agrees with itself: no op, no tensor arithmetic
    flag = (value.detach() * 0).to(torch.float32)  # in the input's precision first: inf * 0 is NaN
    return hvd.allreduce_async_(flag, op=hvd.Average, name=name, prescale_factor=1.0 / gradient_predivide_factor,
                                postscale_factor=gradient_predivide_factor)


@dataclass
class _Done:
    tensor: torch.Tensor


def all_finite(handle: Any) -> bool:
    """The verdict of nonfinite_flag_async, the same on every rank (waits for the allreduce)."""
    if isinstance(handle, _Done):
        # A host read is ~1 us where isfinite().all() costs ~20 us of eager ops a step (on a GPU both sync).
        return math.isfinite(float(handle.tensor))
    wait_quietly([handle])
    return bool(torch.isfinite(hvd.synchronize(handle)).all())


def broadcast_object(obj: Any, name: str) -> Any:
    return hvd.broadcast_object(obj, root_rank=0, name=name)


def allgather_object(obj: Any, name: str) -> list[Any]:
    return hvd.allgather_object(obj, name=name)
