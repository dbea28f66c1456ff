"""Collectives the loop and its tools use: sums, averages, objects, the non-finite vote."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hvdtrain.distributed import wire
from hvdtrain.distributed.runtime import hvd
from hvdtrain.distributed.wait import wait_quietly


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # Horovod: every rank starts from rank 0's weights and optimizer state (bf16 ones sent as float32). State
    # first: Horovod fills a rank's empty state with a step on zero gradients, which weight decay turns into a step
    # of that rank's weights; where rank 0 holds a loaded state and the others none (hvdtrain.load), only the
    # weights sent after it make them equal. Where every state is empty, both orders give the same weights.
    wire.broadcast_optimizer_state(optimizer)
    wire.broadcast_parameters(model.state_dict())


def allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    # Alone, a sum is the tensor: skip Horovod's background-thread round trip (as its own
    # DistributedOptimizer does at size 1).
    return tensor.clone() if hvd.size() == 1 else wire.allreduce(tensor, op=hvd.Sum, name=name)


def by_device(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of `tensors` grouped by device, in first-seen order (the same on every rank).

    Example:
        >>> by_device([torch.zeros(1), torch.zeros(2, device="meta"), torch.zeros(3)])
        [[0, 2], [1]]
    """
    groups: dict[torch.device, list[int]] = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(tensor.device, []).append(i)
    return list(groups.values())


def average_buffers(buffers: list[torch.Tensor]) -> None:
    """Average float buffers (BatchNorm running statistics) over the ranks, in place, one grouped op per device.

    Without it every rank keeps statistics of its own shard: evaluation would differ by rank and the
    replicas would not be equal at the end. With --stages K the buffers live on K GPUs, and Horovod's
    grouped_allreduce needs every tensor of a group on one device.
    """
    if hvd.size() == 1 or not buffers:
        return
    for n, group in enumerate(by_device(buffers)):
        averaged = wire.grouped_allreduce([buffers[i].detach() for i in group], op=hvd.Average, name=f"buffers.{n}")
        with torch.no_grad():
            for i, value in zip(group, averaged, strict=True):
                buffers[i].copy_(value)


def nonfinite_flag_async(value: torch.Tensor, name: str, gradient_predivide_factor: float = 1.0,
                         slot: torch.Tensor | None = None, op: Any = None) -> Any:
    """Start the ranks' agreement on whether `value` (one element) is finite on every rank; all_finite() answers.

    Sent after backward as an fp32 average with DistributedOptimizer's own scale factors, so that
    Horovod fuses it into the step's last gradient allreduce instead of negotiating an op of its own
    (an extra op cost up to ~10% of a communication-bound step; benchmarks/README.md). `slot`: a float32
    element to hold the flag (the one after the last bucket's gradients, gradients.GradientViews.flag). `op`: the
    buckets' op where they are summed (gradients.scale_before_sending), since only like ops fuse; NaN or 0 either
    way."""
    if hvd.size() == 1:
        return _Done(value.detach())    # one rank agrees with itself: no op, no tensor arithmetic
    flag = (value.detach() * 0).to(torch.float32)  # in the input's precision first: inf * 0 is NaN
    if slot is not None:
        flag = slot.copy_(flag.reshape(slot.shape))
    if op is not None:
        return hvd.allreduce_async_(flag, op=op, name=name)
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


def any_rank(flag: bool, name: str) -> bool:
    """True on every rank when `flag` is True on any of them (one allreduce of a single number)."""
    return bool(allreduce_sum(torch.tensor([float(flag)]), name=name).item() > 0)
