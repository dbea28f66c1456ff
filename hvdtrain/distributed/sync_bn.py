"""SyncBatchNorm: BatchNorm statistics over the global batch, on CPU as well as CUDA."""
from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvdtrain.distributed.runtime import hvd


def convert_sync_bn(module: torch.nn.Module, name: str = "") -> torch.nn.Module:
    """Replace every BatchNorm layer with a SyncBatchNorm that shares its parameters and buffers.

    Sharing (not copying) keeps an optimizer built beforehand pointing at the right tensors.
    """
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        sync = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                             module.track_running_stats)
        for key, value in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            setattr(sync, key, value)
        sync.train(module.training)
        sync.allreduce_name = f"sync_bn.{name or 'root'}"  # the same on every rank: one module tree
        return sync
    for key, child in module.named_children():
        setattr(module, key, convert_sync_bn(child, f"{name}.{key}" if name else key))
    return module


class _SumOverRanks(torch.autograd.Function):
    """A differentiable sum over ranks whose forward AND backward allreduces carry the layer's own name.

    Horovod's differentiable allreduce names its backward op by a per-process counter, and its CUDA
    SyncBatchNorm uses one fixed set of names for every layer. With --stages K the autograd engine runs each
    GPU's backward in its own thread, so two layers' ops can be submitted at once, in a different order on
    each rank: fixed or counted names then pair different layers' tensors. Per-layer names cannot.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str) -> torch.Tensor:
        ctx.name = name
        return hvd.allreduce(tensor, op=hvd.Sum, name=f"{name}.forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return hvd.allreduce(grad, op=hvd.Sum, name=f"{ctx.name}.backward"), None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the global batch, on CPU and CUDA alike, with per-layer allreduce names.

    The training-mode statistics are per-channel sums allreduced by `_SumOverRanks`, whose backward sums
    the statistics' gradients across workers too: forward and backward equal one BatchNorm over the global
    batch. Cost: one small allreduce per layer in forward and one in backward. Eval mode and a single
    worker run plain BatchNorm. (Horovod's own SyncBatchNorm is CUDA-only and names every layer's ops
    alike, which pipeline stages in threads can mix up: see `_SumOverRanks`.)
    """

    allreduce_name = "sync_bn"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or hvd.size() == 1:
            return _BatchNorm.forward(self, input)
        self._check_input_dim(input)
        channels, dims = input.shape[1], [0, *range(2, input.dim())]
        wide = input.to(torch.float64)  # float64 sums: E[x^2] - E[x]^2 without cancellation trouble
        local = torch.cat([wide.sum(dims), (wide * wide).sum(dims),
                           torch.tensor([input.numel() / channels], dtype=torch.float64, device=input.device)])
        # Horovod: global sums, identical on every rank, so running statistics stay identical too.
        total = _SumOverRanks.apply(local.to(input.device), self.allreduce_name)
        count = total[-1]
        mean = total[:channels] / count
        var = total[channels:2 * channels] / count - mean * mean
        if self.running_mean is not None and self.running_var is not None and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():  # as torch's BatchNorm: the unbiased variance goes into the running stats
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_((var * count / (count - 1)).to(self.running_var.dtype), momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = ((wide - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)).to(input.dtype)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
