"""bfloat16 on Horovod's wire: as bfloat16 with hvdtrain's patched Horovod, else as float32.

hvdtrain's build of Horovod (scripts/horovod/patches, 0007) has a bfloat16 data type: bf16 tensors go to the
collectives as they are, and `--compression bf16` sends float gradients as bf16 (Bf16Compressor). Horovod
0.28.1 as released refuses a bf16 tensor ("Tensor type torch.BFloat16Tensor is not supported."); with such a
build (an old cached wheel) every bf16 tensor hvdtrain hands to a collective is upcast to float32, sent, and
cast back into the original tensor: exact for broadcasts (bf16 -> fp32 -> bf16 round-trips), an average
rounded once to bf16 for allreduces, at twice the bf16 bytes on the wire. Other dtypes pass through unchanged.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hvdtrain.distributed.runtime import hvd, native_bf16

NARROW = torch.bfloat16     # what Horovod 0.28.1 cannot carry
WIDE = torch.float32        # what it travels as


def widen(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor Horovod is given: a bf16 tensor as float32 where Horovod lacks bf16, else the tensor itself."""
    return tensor.to(WIDE) if tensor.dtype == NARROW and not native_bf16() else tensor


class Bf16AsFp32:
    """A Horovod Compression for DistributedOptimizer: bf16 gradients are allreduced as float32.

    compress() returns the tensor to allreduce and the dtype to restore; decompress() casts back. Anything
    not bf16 goes through untouched (as Horovod's Compression.none).
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
        return (tensor.to(WIDE), NARROW) if tensor.dtype == NARROW else (tensor, None)

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype | None) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Bf16Compressor(Bf16AsFp32):
    """`--compression bf16`: float gradients are allreduced as bfloat16 and cast back to their own dtype.

    Half of fp32's bytes with fp32's exponent range (fp16 overflows above 65504); the sum is rounded to bf16's
    8-bit mantissa. Needs Horovod's bfloat16 (hvdtrain's patched build). Non-float tensors pass through.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
        if tensor.dtype.is_floating_point and tensor.dtype != NARROW:
            return tensor.to(NARROW), tensor.dtype
        return tensor, None


def no_compression() -> Any:
    """What DistributedOptimizer gets for `--compression none`: Horovod's own, or bf16 through float32."""
    return hvd.Compression.none if native_bf16() else Bf16AsFp32


def broadcast_parameters(state: Mapping[str, torch.Tensor]) -> None:
    """hvd.broadcast_parameters(state, root_rank=0), bf16 entries through float32; in place, as Horovod's."""
    wide = {key: widen(value) for key, value in state.items()}
    hvd.broadcast_parameters(wide, root_rank=0)
    with torch.no_grad():
        for key, value in state.items():
            if wide[key] is not value:
                value.copy_(wide[key])


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """hvd.broadcast_optimizer_state(optimizer, root_rank=0), bf16 state (e.g. momentum of bf16 weights)
    through float32. Without bf16 parameters this is Horovod's call alone."""
    if native_bf16() or not any(p.dtype == NARROW for group in optimizer.param_groups for p in group["params"]):
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return
    _init_state(optimizer)  # Horovod would do it inside its call: the state must exist before it is swapped
    if not optimizer.state:
        return          # a stateless optimizer (SGD without momentum): nothing to send, as in Horovod's call
    swapped = []
    for per_param in optimizer.state.values():
        for key, value in per_param.items():
            if torch.is_tensor(value) and value.dtype == NARROW:
                swapped.append((per_param, key, value))
                per_param[key] = value.to(WIDE)
    try:
        # Horovod reads optimizer.state_dict(), whose tensors are these float32 ones, and broadcasts in place.
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    finally:
        with torch.no_grad():
            for per_param, key, value in swapped:
                value.copy_(per_param[key])
                per_param[key] = value


def _init_state(optimizer: torch.optim.Optimizer) -> None:
    """Horovod's own start of a new optimizer's state: one step with zero gradients, on every rank alike.

    As in hvd.broadcast_optimizer_state: DistributedOptimizer's own step() would allreduce (and deadlock
    unless every rank called it), so the wrapped optimizer class's step() is called instead.
    """
    if optimizer.state:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    if type(optimizer).__module__ == hvd.DistributedOptimizer.__module__:
        super(type(optimizer), optimizer).step()  # type: ignore[misc]  # the wrapped class's, as Horovod
    else:
        optimizer.step()


def grouped_allreduce(tensors: list[torch.Tensor], **kwargs: Any) -> list[torch.Tensor]:
    """hvd.grouped_allreduce(tensors, **kwargs), bf16 tensors through float32; results in the inputs' dtypes."""
    results = hvd.grouped_allreduce([widen(tensor) for tensor in tensors], **kwargs)
    return [result.to(tensor.dtype) for result, tensor in zip(results, tensors, strict=True)]


def allreduce(tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """hvd.allreduce(tensor, **kwargs), a bf16 tensor through float32; the result in the input's dtype."""
    return hvd.allreduce(widen(tensor), **kwargs).to(tensor.dtype)
