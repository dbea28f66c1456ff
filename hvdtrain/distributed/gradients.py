"""Horovod's DistributedOptimizer, wrapped and synchronised the way the loop needs."""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, cast

import torch

from hvdtrain.distributed import horovod_optimizer, wire
from hvdtrain.distributed.runtime import hvd, native_bf16
from hvdtrain.distributed.wait import wait_quietly
from hvdtrain.errors import UserError


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *, accumulate: int = 1,
                   compression: str = "none", op: str = "average",
                   gradient_predivide_factor: float = 1.0, bucket_mb: float = 0.0) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer: gradients are averaged (or Adasum-combined) as backward produces them.

    accumulate: backward passes per step; the allreduce starts in the last one (gradients add up locally).
    compression: "fp16" / "bf16" send float gradients as float16 / bfloat16 and restore their dtype after the
        allreduce; "none" sends them as they are (bf16 ones as float32 where Horovod lacks bfloat16).
    bucket_mb: > 0 submits gradients in buckets of about this size, as DDP does (see `buckets`), with Gloo
        ops; 0: each gradient alone, as soon as backward produces it.
    """
    if op == "adasum" and hvd.size() > 1 and not hvd.mpi_enabled():
        raise UserError("op adasum needs Horovod's MPI operations (Gloo has no Adasum): launch with "
                        "horovodrun --mpi, or use --op average")
    if compression == "bf16" and not native_bf16():
        raise UserError("compression bf16 needs bfloat16 in Horovod, and this Horovod was built without "
                        "hvdtrain's bfloat16 patch (an older cached wheel): re-run `make setup` (or "
                        "scripts/install-horovod), or use --compression fp16")
    bucketed = bucket_mb > 0 and _groups_apply(op, gradient_predivide_factor)
    groups = buckets(model.parameters(), bucket_mb) if bucketed else None
    compressor = {"fp16": hvd.Compression.fp16, "bf16": wire.Bf16Compressor}.get(compression, wire.no_compression())
    wrapped = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compressor,
        backward_passes_per_step=accumulate, op=hvd.Adasum if op == "adasum" else hvd.Average,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups)
    if groups and compression == "none" and os.environ.get("HVDTRAIN_GRAD_VIEWS", "1") != "0":
        keep_gradient_views(wrapped, GradientViews(groups))
    if groups and compression == "none" and os.environ.get("HVDTRAIN_SCALE_FIRST", "1") != "0":
        scale_before_sending(wrapped)
    return wrapped


# DDP's first bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES): the last layers' gradients go out
# early, so the exchange starts while backward still runs.
FIRST_BUCKET_MB = 1.0


def buckets(params: Iterable[torch.nn.Parameter], cap_mb: float) -> list[list[torch.nn.Parameter]]:
    """Parameters in reverse order (roughly the order backward produces their gradients), cut into buckets
    of at most `cap_mb` MB (the first FIRST_BUCKET_MB), a parameter larger than the cap alone, and where the
    dtype or device changes (a bucket is one fused buffer, as in DDP).

    Horovod's DistributedOptimizer(groups=...) submits a bucket as one grouped allreduce once all of its
    gradients are ready: one enqueue per bucket instead of one per parameter, so its background thread
    negotiates (a Gloo round per cycle on every rank) only while a bucket is out, not all through backward
    (benchmarks/results/2026-12-06-e-buckets).

    Example:
        >>> [[tuple(p.shape) for p in b] for b in buckets(torch.nn.Linear(512, 512).parameters(), 1.0)]
        [[(512,)], [(512, 512)]]
    """
    groups: list[list[torch.nn.Parameter]] = [[]]
    size, cap = 0, min(FIRST_BUCKET_MB, cap_mb) * 2**20
    for param in reversed([p for p in params if p.requires_grad]):
        nbytes = param.numel() * param.element_size()
        last = groups[-1][-1] if groups[-1] else param
        if groups[-1] and (size + nbytes > cap or (param.dtype, param.device) != (last.dtype, last.device)):
            groups.append([])
            size, cap = 0, cap_mb * 2**20
        groups[-1].append(param)
        size += nbytes
    return [group for group in groups if group]


class GradientViews:
    """One flat buffer per bucket, each gradient a view of its slice (DDP's gradient_as_bucket_view).

    Backward then adds each gradient into its slice in place, so a bucket's gradients lie back to back in memory,
    in the bucket's order, and hvdtrain's patched Horovod allreduces them there (scripts/horovod/patches, 0010): no copy
    into its fusion buffer and out again on the background thread. Correct either way: a Horovod without the patch,
    or a gradient that is no longer a view (replaced by user code), takes the fusion buffer as before.
    """

    def __init__(self, groups: list[list[torch.nn.Parameter]]):
        # The first bucket (the last layers, sent first in backward) has one more float32 element after its
        # gradients when it is float32: `flag`, where the step's non-finite-loss flag is written before backward.
        # It is sent as part of that bucket, so the ranks know whether to step once the first bucket is back
        # (bucket_step.py), at no negotiation of its own.
        extra = [1 if groups[0][0].dtype == torch.float32 else 0] + [0] * (len(groups) - 1)
        self.flats = [torch.zeros(sum(p.numel() for p in group) + more, dtype=group[0].dtype, device=group[0].device)
                      for group, more in zip(groups, extra, strict=True)]
        self.groups = groups
        self.flag = self.flats[0][-1:] if extra[0] else None

    def attach(self) -> None:
        """Zero the buffers and make every gradient its slice again (after zero_grad set them to None)."""
        for flat, group in zip(self.flats, self.groups, strict=True):
            flat.zero_()
            start = 0
            for param in group:
                param.grad = flat[start:start + param.numel()].view_as(param)
                start += param.numel()


def keep_gradient_views(optimizer: Any, views: GradientViews) -> None:
    """Attach the views now, and again after every zero_grad(): torch 2.x's sets gradients to None, and backward
    would then hand each parameter a fresh tensor of its own."""
    plain_zero_grad = optimizer.zero_grad

    def zero_grad(set_to_none: bool = True) -> None:
        plain_zero_grad()   # Horovod's check that no allreduce is in flight
        views.attach()

    optimizer.zero_grad = zero_grad
    optimizer.gradient_views = views
    views.attach()


def scale_before_sending(optimizer: Any) -> None:
    """Each bucket is divided by the number of workers on the main thread, then summed, as DDP does.

    Horovod's average divides after the sum, on its one background thread (0.7-1.6 ms for a 20 MB bucket), and
    only then negotiates the next bucket: over 1 Gbit/s links that left the link idle between the last two buckets
    (benchmarks/results/2026-12-06-i-network-inplace). Here the division is done when the bucket is submitted,
    usually while the previous one is still on the wire. With a power-of-two number of workers the result is the
    same bit for bit (halving is exact); otherwise it differs from Horovod's average only in rounding.
    With gradient views, the first bucket carries the step's non-finite-loss flag (`GradientViews.flag`), summed
    with it: `optimizer.loss_flag_slot` is where the loop writes the flag before backward.
    """
    scale = 1.0 / hvd.size()
    views = getattr(optimizer, "gradient_views", None)
    # Horovod's group of the first bucket (its parameters that the optimizer holds; filled only with several ranks).
    first = horovod_optimizer.bucket_of(optimizer, views.groups[0][0]) if views is not None else None
    flag = views.flag if views is not None and (first is not None or hvd.size() == 1) else None

    def grouped_allreduce_grad_async(params: tuple[torch.nn.Parameter, ...]) -> tuple[Any, list[None]]:
        # Set before a bucket is sent: by backward, or zeros where this rank skipped one (send_unfinished_buckets).
        grads = [cast(torch.Tensor, p.grad) for p in params]
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)   # Horovod: each worker's share of the average, before sending
        if flag is not None and params is first:
            grads.append(flag)                  # Horovod: NaN if any rank's loss was not finite, else 0
        handle = hvd.grouped_allreduce_async_(grads, name=horovod_optimizer.parameter_name(optimizer, params[0]),
                                              op=hvd.Sum, process_set=optimizer.process_set)
        return handle, [None] * len(params)   # no compression: nothing for decompress

    horovod_optimizer.replace_bucket_send(optimizer, grouped_allreduce_grad_async)
    optimizer.loss_flag_op = hvd.Sum
    optimizer.loss_flag_slot, optimizer.loss_flag_bucket = flag, first


def _groups_apply(op: str, gradient_predivide_factor: float) -> bool:
    # Horovod 0.28.1's grouped path drops the pre/postscale factors and Adasum has no groups; an elastic
    # job's optimizer would broadcast its groups from rank 0 when it is built, which a worker added later
    # does while the others are in their reset: per-tensor there. With MPI ops buckets did not win (a rank with
    # a bucket out polls Open MPI until its peer's is complete; benchmarks/results/2026-12-06-e-buckets).
    return (op == "average" and gradient_predivide_factor == 1.0 and os.environ.get("HOROVOD_ELASTIC") != "1"
            and not hvd.mpi_enabled())


def steps_in_backward(op: str) -> bool:
    """Adasum with several workers applies each tensor's update inside backward, then combines the deltas."""
    return op == "adasum" and hvd.size() > 1


def synchronize_gradients(optimizer: Any) -> None:
    """DistributedOptimizer.synchronize(), after sleeping until this step's gradient allreduces are done."""
    send_unfinished_buckets(optimizer)
    # A None or callable handle is not an op in flight.
    in_flight = horovod_optimizer.in_flight(optimizer).values()
    wait_quietly(handle for handle, _ in in_flight if isinstance(handle, int))
    optimizer.synchronize()


def send_unfinished_buckets(optimizer: Any) -> None:
    """Send every bucket whose gradients this rank's backward did not all produce (a layer skipped on this
    rank, or on every rank) as the one grouped allreduce its peers send, the missing gradients as zeros.

    Horovod 0.28.1's synchronize() would send such a bucket's parameters one by one, under other names than the
    peers' grouped allreduce: a model whose ranks use different parameters in a step stalled. Per tensor,
    Horovod likewise sends zeros for a parameter without a gradient, so the average is the same.
    """
    handles = horovod_optimizer.in_flight(optimizer)
    for group in horovod_optimizer.bucket_groups(optimizer):
        if group in handles:   # its hooks sent it
            continue
        for param in group:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        horovod_optimizer.send_bucket(optimizer, group)
