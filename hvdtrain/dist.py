"""The one module that imports horovod.torch. Everything distributed goes through here."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from hvdtrain.errors import UserError

try:
    import horovod.torch as hvd
except ImportError as _err:  # doctor explains; the trainer cannot run without it
    hvd = None
    _IMPORT_ERROR: Exception | None = _err
else:
    _IMPORT_ERROR = None


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def _require() -> Any:
    if hvd is None:
        raise UserError(f"Horovod is not usable here ({_IMPORT_ERROR}); run `make setup` "
                        "or scripts/install-horovod, then `hvdtrain doctor`")
    return hvd


def init() -> World:
    """Start Horovod (idempotent) and say who we are."""
    h = _require()
    h.init()
    return world()


def world() -> World:
    """Who we are now (it changes after an elastic reset)."""
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def shutdown() -> None:
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
    # Horovod: gradients are averaged across workers as backward produces them.
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)


def allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    return hvd.allreduce(tensor, op=hvd.Sum, name=name)


def broadcast_object(obj: Any, name: str) -> Any:
    return hvd.broadcast_object(obj, root_rank=0, name=name)


def allgather_object(obj: Any, name: str) -> list[Any]:
    return hvd.allgather_object(obj, name=name)


def built_info() -> dict[str, bool]:
    h = _require()
    return {"mpi": h.mpi_built(), "gloo": h.gloo_built(), "nccl": bool(h.nccl_built())}


def elastic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values: Any) -> Any:
    """Horovod's TorchState: model, optimizer and plain values saved on commit, restored on failure."""
    return hvd.elastic.TorchState(model=model, optimizer=optimizer, **values)


def run_elastic(fn: Any) -> Any:
    """Wrap fn(state) so Horovod re-runs it from the last commit after a worker joins or leaves."""
    return hvd.elastic.run(fn)


def is_peer_failure(err: BaseException) -> bool:
    """True when this rank failed only because another rank went away (its error is the real one)."""
    if hvd is None:
        return False
    from horovod.common.exceptions import HorovodInternalError

    return isinstance(err, HorovodInternalError) or "shut down" in str(err)


@dataclass
class AllreduceCount:
    """Gradient allreduces submitted by Horovod's DistributedOptimizer, as the wire sees them."""
    calls: int = 0
    bytes: int = 0              # after compression: fp16 halves it
    names: list[str] = field(default_factory=list)


@contextmanager
def count_gradient_allreduces() -> Iterator[AllreduceCount]:
    """Count what DistributedOptimizer hands to Horovod (tensor count and bytes) while inside.

    For tests and benchmarks: it wraps the functions horovod.torch.optimizer calls, so the counts are
    of the tensors actually allreduced (compressed ones included), not of what we think we sent.
    Example:
        >>> with dist.count_gradient_allreduces() as count:
        ...     trainer.fit()
        >>> count.bytes / trainer.progress.step   # 4 x parameters in fp32
    """
    from horovod.torch import optimizer as hvd_optimizer

    count = AllreduceCount()
    single, grouped = hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_

    def record(tensor: torch.Tensor, name: str | None) -> None:
        count.calls += 1
        count.bytes += tensor.numel() * tensor.element_size()
        count.names.append(name or "")

    def counted_single(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        record(tensor, kwargs.get("name"))
        return single(tensor, *args, **kwargs)

    def counted_grouped(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        for tensor in tensors:
            record(tensor, kwargs.get("name"))
        return grouped(tensors, *args, **kwargs)

    hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = counted_single, counted_grouped
    try:
        yield count
    finally:
        hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = single, grouped
