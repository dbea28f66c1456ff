"""Where a worker computes: its device and its share of this host's cores."""
from __future__ import annotations

import os
import socket

import torch

from hvdtrain.distributed import collectives
from hvdtrain.environment.process import FIRST_GPU_ENV
from hvdtrain.errors import UserError
from hvdtrain.models.pipeline import assign_devices


def pick_device(choice: str, local_rank: int, *, local_size: int = 1, stages: int = 1,
                views: list[tuple[str, list[str]]] | None = None) -> torch.device:
    """This worker's first device; with CUDA, pinned as the current device. `--device cpu` never starts CUDA.

    `views` is every rank's (host, visible GPU ids), gathered here when None: where the workers of a host
    see disjoint GPUs (one process per GPU) each takes its own first GPU, else its share by local rank.
    Raises a one-line UserError when this host's workers x stages outnumber its visible GPUs: NCCL
    would otherwise abort at the first broadcast ("Duplicate GPU detected").
    """
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("device cuda was asked for but torch sees no CUDA device; use --device cpu")
    visible = torch.cuda.device_count()
    if views is None:
        # Horovod: every rank on a CUDA path says which GPUs it sees, to tell one-process-per-GPU layouts apart.
        views = collectives.allgather_object((socket.gethostname(), gpu_ids(visible)), name="hvdtrain.gpu_views")
    given = os.environ.get(FIRST_GPU_ENV, "")
    if given.isdigit():
        first = int(given)
        if first + stages > visible:
            raise UserError(f"{FIRST_GPU_ENV}={given} with --stages {stages} needs {first + stages} visible GPUs but "
                            f"{visible} are visible; give each worker at least {stages} GPUs")
    else:
        # Horovod: one GPU per worker (K with --stages K), chosen by its rank on this host, never shared.
        own = own_gpu_view(views, socket.gethostname())
        first = assign_devices(local_rank, local_size, stages, visible, own_view=own)[0]
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


def gpu_ids(visible: int) -> list[str]:
    """Ids of the GPUs this process sees, the same for one GPU in every process: UUIDs (torch >= 2.0 has them);
    without one, name, index and CUDA_VISIBLE_DEVICES, which tell shared views from per-process ones apart."""
    ids = []
    for index in range(visible):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        ids.append(str(uuid) if uuid is not None else f"{props.name}:{index}:{os.environ.get('CUDA_VISIBLE_DEVICES')}")
    return ids


def own_gpu_view(views: list[tuple[str, list[str]]], host: str) -> bool:
    """Whether the workers on `host` each see GPUs no other of them sees (Slurm --gpus-per-task=1, a
    container per GPU): then each takes its own first GPU instead of the local_rank-th.

    Example:
        >>> own_gpu_view([("n1", ["GPU-a"]), ("n1", ["GPU-b"]), ("n2", ["GPU-a"])], "n1")
        True
        >>> own_gpu_view([("n1", ["GPU-a", "GPU-b"]), ("n1", ["GPU-a", "GPU-b"])], "n1")
        False
    """
    mine = [ids for name, ids in views if name == host]
    seen = [gpu for ids in mine for gpu in ids]
    return len(mine) > 1 and bool(seen) and len(seen) == len(set(seen))
