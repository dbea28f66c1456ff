"""Test instrumentation: count the gradient allreduces Horovod's DistributedOptimizer submits."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AllreduceCount:
    """Gradient allreduces submitted by Horovod's DistributedOptimizer, as the wire sees them."""
    calls: int = 0
    submissions: int = 0        # calls into Horovod: a grouped allreduce (a bucket of gradients) is one
    bytes: int = 0              # after compression: fp16 halves it
    names: list[str] = field(default_factory=list)


@contextmanager
def count_gradient_allreduces() -> Iterator[AllreduceCount]:
    """Count what DistributedOptimizer hands to Horovod (tensor count and bytes) while inside.

    For tests and benchmarks: it wraps the functions horovod.torch.optimizer calls, so the counts are
    of the tensors actually allreduced (compressed ones included), not of what we think we sent.
    Example:
        >>> with count_gradient_allreduces() as count:
        ...     trainer.fit()
        >>> count.bytes / trainer.progress.step   # 4 x parameters in fp32
    """
    import horovod.torch as hvd
    from horovod.torch import optimizer as hvd_optimizer

    count = AllreduceCount()
    single, grouped = hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_

    def record(tensor: torch.Tensor, name: str | None) -> None:
        count.calls += 1
        count.bytes += tensor.numel() * tensor.element_size()
        count.names.append(name or "")

    def counted_single(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        record(tensor, kwargs.get("name"))
        count.submissions += 1
        return single(tensor, *args, **kwargs)

    def counted_grouped(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        for tensor in tensors:
            record(tensor, kwargs.get("name"))
        count.submissions += 1
        return grouped(tensors, *args, **kwargs)

    hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = counted_single, counted_grouped
    # hvdtrain's buckets, divided before they are sent, call hvd's grouped one (gradients.scale_before_sending);
    # hvd's single one stays as it is: the loss flag and the metrics call it, and they are not gradients.
    hvd.grouped_allreduce_async_ = counted_grouped
    try:
        yield count
    finally:
        hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = single, grouped
        hvd.grouped_allreduce_async_ = grouped
