"""Horovod elastic: the state saved on commit and the retry loop around a training function."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from hvdtrain.distributed import wire
from hvdtrain.distributed.runtime import hvd, native_bf16
from hvdtrain.environment import process


def elastic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values: Any) -> Any:
    """Horovod's TorchState: model, optimizer and plain values saved on commit, restored on failure.

    `values` are plain objects (no samplers or other modules: only model and optimizer get the bf16-aware sync).
    """
    return _state_class()(model=model, optimizer=optimizer, **values)


def _state_class() -> type:
    class State(hvd.elastic.TorchState):
        """TorchState whose sync (the broadcast from rank 0 after a reset) carries bf16 weights and optimizer
        state where Horovod lacks bfloat16: Horovod's own handlers would raise "Tensor type
        torch.BFloat16Tensor is not supported.", wire's send them through float32."""

        def sync(self) -> None:
            if native_bf16():
                super().sync()
                return
            wire.broadcast_parameters(self.model.state_dict())
            wire.broadcast_optimizer_state(self.optimizer)
            super(hvd.elastic.TorchState, self).sync()    # the plain values, as TorchState.sync ends

    return State


def run_elastic(fn: Any, while_resetting: Callable[[], AbstractContextManager[Any]] | None = None) -> Any:
    """Wrap fn(state) so Horovod re-runs it from the last commit after a worker joins or leaves.

    `while_resetting()` is entered around Horovod's re-forming of the world (shutdown, then an init that
    blocks until the driver has a new world: below --min-np, possibly for ever).
    """
    from horovod.common.elastic import run_fn

    def reset() -> None:   # hvd.elastic.run's own reset, watched
        with while_resetting() if while_resetting else nullcontext():
            hvd.shutdown()
            hvd.init()
        process.export_rank_env()       # a new world: new ranks for libraries that read RANK/WORLD_SIZE

    return run_fn(fn, reset)
