"""The optimizer steps each bucket's parameters as soon as that bucket's allreduce is back, while later buckets are
still on the wire.

DDP, and Horovod's synchronize(), wait for the last bucket before the optimizer starts. Over 1 Gbit/s links the last
bucket (the first layers, sent when backward ends) is on the wire for ~200 ms of a ResNet-18 step, and the main
thread only waits. Here it steps the other buckets' parameters in that time, and only the last bucket's step is
left after it (benchmarks/results/2026-12-07-a-step-by-bucket).

The result is the same bit for bit: each parameter is updated once, from the same averaged gradient, by the same
optimizer. This holds for optimizers whose update of a parameter reads only that parameter's gradient and state
(`ELEMENTWISE`). An optimizer of another class, or one with step hooks, steps once after the last bucket.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from hvdtrain.distributed import horovod_optimizer
from hvdtrain.distributed.gradients import send_unfinished_buckets
from hvdtrain.distributed.runtime import hvd
from hvdtrain.distributed.wait import wait_quietly

# torch.optim's optimizers that update each parameter from its own gradient and state alone (a subclass may not:
# it could clip by the global norm in step()). LBFGS, which needs every gradient at once, is not one.
ELEMENTWISE: tuple[type, ...] = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax,
                                 torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad,
                                 torch.optim.Adadelta, torch.optim.Rprop, torch.optim.ASGD)


def can_step_by_bucket(optimizer: Any) -> bool:
    """Whether `optimizer` (Horovod's DistributedOptimizer, just wrapped) may step bucket by bucket: buckets (which
    Horovod forms only with several ranks), a per-parameter optimizer, every trainable parameter in a bucket. Step
    hooks, which can be added later, are for has_step_hooks() at each step."""
    groups = horovod_optimizer.bucket_groups(optimizer)
    if not groups or os.environ.get("HVDTRAIN_STEP_BY_BUCKET", "1") == "0":
        return False
    user_class = type(optimizer).__mro__[1]   # Horovod's wrapper is a subclass of the user's optimizer's class
    if user_class not in ELEMENTWISE:
        return False
    bucketed = {id(p) for group in groups for p in group}
    return all(id(p) in bucketed for group in optimizer.param_groups for p in group["params"] if p.requires_grad)


def step_by_bucket(optimizer: Any, first: tuple[torch.nn.Parameter, ...] | None,
                   may_step: Callable[[], bool]) -> bool:
    """Wait for each bucket's allreduce and step its parameters at once: `first` (the bucket that carries the loss
    flag) first, then the rest in the order they were sent.

    may_step: asked once, after the first bucket is back; False skips the step (every bucket is still waited for).
    Returns may_step's answer.
    """
    send_unfinished_buckets(optimizer)
    handles = horovod_optimizer.in_flight(optimizer)
    order: list[tuple[torch.nn.Parameter, ...]] = [first] if first is not None and first in handles else []
    order += [key for key in handles if key is not first]
    everyone = [p for group in optimizer.param_groups for p in group["params"]]
    allowed: bool | None = None
    try:
        for bucket in order:
            _take_result(optimizer, bucket, *handles.pop(bucket))
            if allowed is None:
                allowed = may_step()
            if allowed:
                _step_only(optimizer, bucket, everyone)
    finally:
        for bucket in list(handles):   # an error above: no op may be left in flight
            _take_result(optimizer, bucket, *handles.pop(bucket))
    return bool(allowed) if allowed is not None else may_step()


def _take_result(optimizer: Any, bucket: tuple[torch.nn.Parameter, ...], handle: Any, ctx: Any) -> None:
    # What Horovod's synchronize() does for one grouped handle.
    wait_quietly([handle])
    # The first bucket's outputs end with the loss flag, which is no parameter's (bucket_received leaves it).
    horovod_optimizer.bucket_received(optimizer, bucket, hvd.synchronize(handle), ctx)


def _step_only(optimizer: Any, bucket: tuple[torch.nn.Parameter, ...], everyone: list[torch.nn.Parameter]) -> None:
    # torch's optimizers leave a parameter without a gradient as it is: the others' gradients are hidden for this
    # step and given back after it.
    mine = {id(p) for p in bucket}
    hidden = [(p, p.grad) for p in everyone if id(p) not in mine and p.grad is not None]
    for param, _ in hidden:
        param.grad = None
    try:
        with optimizer.skip_synchronize():
            optimizer.step()
    finally:
        for param, grad in hidden:
            param.grad = grad


def has_step_hooks(optimizer: Any) -> bool:
    """Step hooks on this optimizer or on every optimizer: they would run once per bucket."""
    from torch.optim import optimizer as torch_optimizer

    return bool(getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None)
                or getattr(torch_optimizer, "_global_optimizer_pre_hooks", None)
                or getattr(torch_optimizer, "_global_optimizer_post_hooks", None))
