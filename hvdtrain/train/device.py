"""Where a worker computes: its device and its share of this host's cores."""
from __future__ import annotations

import os

import torch

from hvdtrain.errors import UserError
from hvdtrain.models.pipeline import assign_devices


def pick_device(choice: str, local_rank: int, *, local_size: int = 1, stages: int = 1) -> torch.device:
    """This worker's first device; with CUDA, pinned as the current device. `--device cpu` never starts CUDA.

    Raises a one-line UserError when this host's workers x stages outnumber its visible GPUs: NCCL
    would otherwise abort at the first broadcast ("Duplicate GPU detected").
    """
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("device cuda was asked for but torch sees no CUDA device; use --device cpu")
    # Horovod: one GPU per worker (K with --stages K), chosen by its rank on this host, never shared.
    first = assign_devices(local_rank, local_size, stages, torch.cuda.device_count())[0]
    torch.cuda.set_device(first)
    return torch.device("cuda", first)


def threads_per_worker(workers_on_host: int, cpu_count: int | None = None) -> int:
    """The one rule for every kind of worker (Horovod rank, Spark task, predict process): an equal share
    of this host's cores, at least one. Oversubscribed intra-op threads make every worker slower.

    Example:
        >>> threads_per_worker(2, cpu_count=16), threads_per_worker(4, cpu_count=2)
        (8, 1)
    """
    cores = os.cpu_count() if cpu_count is None else cpu_count
    return max(1, (cores or 1) // max(1, workers_on_host))
