"""A training loop of the user's own, made data-parallel by one call (`hvdtrain.prepare`), with checkpoints that
resume mid-epoch (`hvdtrain.save`, `hvdtrain.load`).

The thin path beside the Trainer (Accelerate's `prepare`, Fabric's `setup`): the user keeps the loop and changes
nothing else in it. Every piece is the Trainer's own, so both paths train alike: Horovod's start (run_start), this
worker's device (device.pick_device), the LR scaling policy (lr_schedule.scaled_lr), Horovod's DistributedOptimizer
with the Trainer's buckets (distributed/gradients.py), rank 0's weights and optimizer state broadcast, and each
DataLoader rebuilt over the resumable ShardSampler (data/user_loader.py, data/loader.py). A checkpoint is one file
of the Trainer's format (checkpoint/format.py), written by rank 0 atomically.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.loader import rebuild_user_loader
from hvdtrain.data.sharding import ShardSampler, check_fits
from hvdtrain.data.user_loader import unwrap
from hvdtrain.distributed import collectives, gradients, runtime
from hvdtrain.errors import UserError, first_line
from hvdtrain.output.console import console
from hvdtrain.output.plain_weights import PlainWeights
from hvdtrain.train.device import pick_device
from hvdtrain.train.lr_schedule import scaled_lr
from hvdtrain.train.run_start import PROCESS, start_horovod


class ShardedLoader:
    """A user's DataLoader, loading this worker's shard of every epoch (what `hvdtrain.prepare` returns for one).

    Iterate it as the DataLoader; call `set_epoch(epoch)` before each epoch for that epoch's shuffle (the same order
    on every worker, as DistributedSampler's). It counts the batches it hands out, so `hvdtrain.save` records where
    the epoch stands and `hvdtrain.load` starts the next pass there. Other attributes are the DataLoader's.
    """

    def __init__(self, loader: DataLoader, sampler: ShardSampler, batch_size: int) -> None:
        self.loader, self.sampler, self.batch_size = loader, sampler, batch_size
        self.position = 0          # samples of this epoch's order that all workers together have been handed
        self._resume: tuple[int, int] | None = None   # (epoch, position) of a load, for that epoch's set_epoch

    def set_epoch(self, epoch: int) -> None:
        """Begin `epoch`: its own shuffle; where a checkpoint of this epoch was loaded, from its position."""
        start = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None
        self.sampler.set_epoch(epoch, start)
        self.position = start

    def __iter__(self) -> Iterator[Any]:
        if self.position >= self.sampler.epoch_samples():   # a finished pass, and no set_epoch: the same order again
            self.sampler.set_epoch(self.sampler.epoch, 0)
            self.position = 0
        # Horovod: the position is global; after k equal batches on every worker, the first start + k x batch x
        # workers samples of the order are done (ShardSampler strides the order over the workers).
        step = self.batch_size * self.sampler.size
        for batch in self.loader:
            self.position = min(self.position + step, self.sampler.epoch_samples())
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if "loader" not in self.__dict__:   # while unpickling: no DataLoader yet
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at `state`: the next pass (after set_epoch of its epoch, or with no set_epoch) starts there."""
        self._resume = (state["epoch"], state["position"])
        self.sampler.set_epoch(state["epoch"], state["position"])
        self.position = state["position"]


def prepare(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *loaders: DataLoader,
            lr_scaling: str = "linear", bucket_mb: float | None = None, compression: str = "none",
            accumulate: int = 1, seed: int | None = None, device: str = "auto") -> tuple[Any, ...]:
    """Make a loop of your own data-parallel: call it once on every worker, then train as before.

    Args:
        model: on any device; it is moved to this worker's (its own GPU, or the CPU). Rank 0's weights win.
        optimizer: built over `model`'s parameters with the one-worker LR, scaled here by `lr_scaling`.
        loaders: DataLoaders over map-style datasets; each keeps its batch size (per worker), collate_fn, workers,
            shuffle and drop_last, and loads only this worker's shard (see ShardedLoader: call `set_epoch`).
        lr_scaling: "linear" (LR x workers, Goyal et al.), "sqrt", or "none" (the LR as given).
        bucket_mb: gradients allreduced in buckets of about this many MB (0: each alone); default the Trainer's.
        compression: gradients on the wire: "none", "fp16" or "bf16".
        accumulate: backward passes per optimizer.step(); the allreduce runs in the last.
        seed: the shuffle order's seed, the same on every worker; default the Trainer's.
        device: "auto", "cpu" or "cuda".
    Returns:
        A tuple: the model on its device, Horovod's DistributedOptimizer around `optimizer`, then a ShardedLoader
        for each loader, in their order.
    Example:
        >>> model, optimizer, train_loader = hvdtrain.prepare(model, optimizer, train_loader)
        >>> for epoch in range(epochs):
        ...     train_loader.set_epoch(epoch)
        ...     for inputs, targets in train_loader: ...
    """
    defaults = TrainConfig()
    values: dict[str, Any] = {
        "lr_scaling": lr_scaling, "bucket_mb": defaults.bucket_mb if bucket_mb is None else bucket_mb,
        "compression": compression, "accumulate": accumulate, "seed": defaults.seed if seed is None else seed,
        "device": device}
    try:
        config = TrainConfig(**values)    # the Trainer's checks of each value, one line each
    except (TypeError, ValueError, UserError) as err:
        raise UserError(f"hvdtrain.prepare: {first_line(err)}") from None
    PROCESS.take_secrets()      # as every run's start: HVDTRAIN_SECRETS_FILE's credentials
    PROCESS.join_slurm_gloo()   # Horovod: srun's tasks without MPI join one Gloo world
    world = start_horovod(config)  # Horovod: who we are; torch's threads a share of this host's cores
    # Horovod: one GPU per worker, chosen by its rank on this host.
    where = pick_device(config.device, world.local_rank, local_size=world.local_size)
    model = model.to(where)        # in place: the optimizer's parameters are the moved ones
    scale = scaled_lr(1.0, world.size, config.lr_scaling)
    for group in optimizer.param_groups:
        group["lr"] *= scale       # Horovod: a global batch `size` times larger takes a larger step
    first_lr = optimizer.param_groups[0]["lr"] if optimizer.param_groups else 0.0
    console.line(f"hvdtrain: lr {first_lr / scale:g} -> {first_lr:g} ({config.lr_scaling} scaling over "
                 f"{world.size} worker{'s' * (world.size != 1)}; lr_scaling='none' keeps it)")
    # Horovod: gradients averaged across workers as backward produces them, in the Trainer's buckets.
    wrapped: Any = gradients.wrap_optimizer(optimizer, model, accumulate=config.accumulate,
                                            compression=config.compression, bucket_mb=config.bucket_mb)
    synchronized_steps(wrapped)
    collectives.broadcast_state(model, wrapped)   # Horovod: every worker starts from rank 0's weights and state
    return (model, wrapped, *(shard(loader, config.seed, world, where) for loader in loaders))


def synchronized_steps(optimizer: Any) -> None:
    """optimizer.step() as the Trainer's step takes it: every bucket sent (one whose gradients backward did not
    all produce, as zeros: plain Horovod would stall there) and waited for without spinning, then the update."""
    plain_step = optimizer.step

    def step(closure: Any = None) -> Any:
        gradients.synchronize_gradients(optimizer)   # Horovod: averaged gradients, equal on every worker
        with optimizer.skip_synchronize():
            return plain_step(closure)

    optimizer.step = step


def shard(loader: DataLoader, seed: int, world: runtime.World, device: torch.device) -> ShardedLoader:
    """The user's loader over this worker's ShardSampler; everything else about loading is theirs."""
    if not isinstance(loader, DataLoader):
        raise UserError(f"hvdtrain.prepare takes the model, the optimizer and DataLoaders; got a "
                        f"{type(loader).__name__} after the optimizer")
    data, settings = unwrap(loader)
    if settings is None or isinstance(data, torch.utils.data.IterableDataset):
        raise UserError("hvdtrain.prepare shards DataLoaders over map-style datasets (with __len__ and "
                        "__getitem__); a stream shards itself: pass it to hvdtrain.Trainer instead")
    check_fits(len(data), world.size)
    # Horovod: each worker its strided share of one shuffled order, padded so every worker takes as many steps.
    sampler = ShardSampler(len(data), world.rank, world.size, seed=seed, shuffle=settings.shuffle,
                           drop_last_batch=settings.batch_size if settings.drop_last else 0)
    rebuilt = rebuild_user_loader(data, sampler, settings, seed=seed, rank=world.rank, device=device)
    return ShardedLoader(rebuilt, sampler, settings.batch_size)


def save(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *loaders: ShardedLoader,
         extra: dict[str, Any] | None = None) -> Path | None:
    """Write a checkpoint on rank 0 (atomically: the old file or the new, never half); nothing elsewhere.

    It holds the model's weights (plain keys, compiled or not), the optimizer's state, each loader's epoch and
    position, and `extra` (plain values and tensors: your epoch counter, a scheduler's state_dict()...). Call it
    on every worker (no collective: the weights, optimizer state and positions are the same on all).

    Returns:
        The file written on rank 0; None on the other ranks.
    Example:
        >>> hvdtrain.save("ckpt.pt", model, optimizer, train_loader, extra={"epoch": epoch})
    """
    if runtime.world().rank != 0:
        return None
    payload = {"model": PlainWeights(model).state_dict(), "optimizer": optimizer.state_dict(),
               "loaders": [loader.state_dict() for loader in loaders], "extra": dict(extra or {}),
               "world_size": runtime.world().size}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return checkpoint.write(target, payload)


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         *loaders: ShardedLoader) -> dict[str, Any]:
    """Resume from a checkpoint of `save`: call it on every worker (a collective), after `prepare`.

    Rank 0 reads the file (the other workers need no copy of it) and loads model and optimizer; Horovod then
    broadcasts them, and each loader resumes at the saved epoch and position, with any number of workers. The
    optimizer's LR is the saved one (scaled for the workers of the run that saved it).

    Returns:
        The `extra` dict given to `save`.
    Raises:
        UserError: on every worker, in one line, where the file is missing, damaged, or does not fit.
    Example:
        >>> extra = hvdtrain.load("ckpt.pt", model, optimizer, train_loader) if os.path.exists("ckpt.pt") else {}
    """
    shared: dict[str, Any] = {}
    if runtime.world().rank == 0:
        shared = read_on_root(Path(path), model, optimizer, len(loaders))
    shared = collectives.broadcast_object(shared, name="hvdtrain.load")   # Horovod: rank 0's verdict for all
    if "error" in shared:
        raise UserError(shared["error"])
    collectives.broadcast_state(model, optimizer)   # Horovod: rank 0's loaded state, then its weights
    for loader, state in zip(loaders, shared["loaders"], strict=True):
        loader.load_state_dict(state)
    return dict(shared["extra"])


def read_on_root(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loaders: int) -> dict[str, Any]:
    """Rank 0: load model and optimizer from `path`; return what the other ranks need, or {"error": line}."""
    try:
        payload = checkpoint.load(path)
    except UserError as err:
        return {"error": str(err)}
    if "loaders" not in payload:
        return {"error": f"{path} is a Trainer's checkpoint, not hvdtrain.save's: resume it with the Trainer "
                         "(--resume)"}
    if len(payload["loaders"]) != loaders:
        return {"error": f"{path} holds the positions of {len(payload['loaders'])} loaders, but {loaders} were "
                         "given to hvdtrain.load: pass the loaders given to hvdtrain.save, in its order"}
    try:
        PlainWeights(model).load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        return {"error": f"checkpoint {path} does not fit this model/optimizer ({first_line(err)})"}
    return {"loaders": payload["loaders"], "extra": payload.get("extra", {})}
