"""Model parallelism within one worker: a model split into stages on several devices, with micro-batches.

A `Pipeline` runs stage s on device s. With M micro-batches it follows GPipe's fill/drain schedule:
at clock tick t, stage s works on micro-batch t - s, so on GPUs (where kernel launches are
asynchronous) the stages compute at the same time. Backward is plain autograd over the same graph,
so the gradients are those of the unsplit model up to float rounding; the loss is computed on the
concatenated outputs, so a mean loss sees the whole batch exactly as without micro-batching.

Hybrid parallelism is this plus Horovod: worker `local_rank` owns devices
`local_rank*K ... local_rank*K+K-1` and Horovod averages gradients across workers as usual.

Parameter names are the original model's (`0.weight`, not `stages.0.0.weight`), so checkpoints and
`model.pt` load into the unsplit model, and an unsplit run's weights load into a pipelined one.
Model code never imports this module.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hvdtrain.errors import UserError


def balanced_split(sizes: Sequence[int], k: int) -> list[int]:
    """Layers per stage: `k` contiguous non-empty groups of layers, parameter counts as even as possible.

    Args:
        sizes: parameter count of each layer, in order.
        k: number of stages.
    Returns:
        How many consecutive layers each stage holds (sums to len(sizes)).
    Example:
        >>> balanced_split([0, 100, 0, 100, 0, 10], 2)
        [3, 3]
    """
    if not 1 <= k <= len(sizes):
        raise UserError(f"cannot split a model of {len(sizes)} layers into {k} stages; use --stages 1..{len(sizes)}")
    total = sum(sizes) or 1
    counts: list[int] = []
    start, running = 0, 0
    for stage in range(k - 1):
        target = total * (stage + 1) / k
        end = start + 1                      # every stage holds at least one layer
        running += sizes[start]
        last_end = len(sizes) - (k - 1 - stage)  # leave a layer for each later stage
        # Take the next layer while that brings this stage's cumulative size closer to the target.
        while end < last_end and abs(running + sizes[end] - target) <= abs(running - target):
            running += sizes[end]
            end += 1
        counts.append(end - start)
        start = end
    counts.append(len(sizes) - start)
    return counts


def assign_devices(local_rank: int, local_size: int, stages: int, visible: int, own_view: bool = False) -> list[int]:
    """The GPU indices one worker owns: `local_rank*stages ... local_rank*stages+stages-1`, never shared.

    With `own_view` (one process per GPU: Slurm's --gpus-per-task, a container per GPU; each worker sees
    only GPUs no other worker on its host sees) a worker owns its first `stages` visible GPUs.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected") at its first collective, so a host
    with fewer visible GPUs than workers x stages is a one-line UserError here, before any collective.

    Args:
        local_rank: this worker's rank on its host.
        local_size: the number of workers on this host.
        stages: GPUs per worker (--stages).
        visible: GPUs this process sees (torch.cuda.device_count()).
    Returns:
        The CUDA device indices of this worker's stages, first stage first.
    Example:
        >>> assign_devices(1, 2, 2, visible=4)
        [2, 3]
        >>> assign_devices(3, 4, 1, visible=1, own_view=True)
        [0]
    """
    if own_view:
        local_rank, local_size = 0, 1
    need = local_size * stages
    if need > visible:
        most = visible // stages
        fewer_stages = visible // max(local_size, 1)
        fixes = [f"--stages {fewer_stages}" if 1 <= fewer_stages < stages else "",
                 f"at most {most} worker{'s' * (most != 1)} per host (horovodrun -np {most} ...)" if most else "",
                 "--device cpu"]
        gpus = f"{visible} GPU{'s' * (visible != 1)}"
        if own_view:
            raise UserError(f"--stages {stages} needs {stages} GPUs per worker but this worker sees {visible}; "
                            f"give each worker {stages} GPUs (srun --gpus-per-task={stages}) or use fewer --stages")
        raise UserError(f"{local_size} worker{'s' * (local_size != 1)} on this host"
                        + (f" x {stages} stages need {need} GPUs but {gpus} visible" if stages > 1
                           else f" but {gpus} visible") + ": use " + " or ".join(f for f in fixes if f))
    return [local_rank * stages + i for i in range(stages)]


def stage_devices(first: torch.device, k: int, visible_gpus: int) -> list[torch.device]:
    """The devices of one worker's k stages: on CUDA the GPUs from the first stage's on (pick_device chose it,
    shared view or own), else CPU k times.

    Raises a one-line UserError when they run past the visible GPUs.
    """
    if first.type != "cuda":
        return [torch.device("cpu")] * k
    start = first.index or 0
    if start + k > visible_gpus:
        raise UserError(f"--stages {k} from GPU {start} needs GPUs up to {start + k - 1} but {visible_gpus} are "
                        "visible; use fewer --stages or workers per host")
    return [torch.device("cuda", start + i) for i in range(k)]


class Pipeline(nn.Module):
    """A model split into stages, stage s on devices[s]; inputs and outputs live on devices[0].

    Args:
        model: an nn.Sequential (split into layers) or a list / nn.ModuleList of stages (one each).
        devices: one device per stage; its length is the number of stages K.
        split: layers per stage for an nn.Sequential (default: balanced by parameter count).
        micro_batches: M, the number of pieces each batch is cut into (GPipe); 1 = no overlap.
    Example:
        >>> pipe = Pipeline(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)),
        ...                 [torch.device("cpu")] * 2, micro_batches=4)
        >>> pipe(torch.randn(16, 8)).shape
        torch.Size([16, 2])
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], devices: Sequence[torch.device], *,
                 split: Sequence[int] = (), micro_batches: int = 1) -> None:
        super().__init__()
        k = len(devices)
        if isinstance(model, nn.Sequential):
            layers = list(model.named_children())
            counts = list(split) or balanced_split(
                [sum(p.numel() for p in layer.parameters()) for _, layer in layers], k)
        elif isinstance(model, (list, tuple, nn.ModuleList)):
            layers = [(str(i), stage) for i, stage in enumerate(model)]
            counts = [1] * len(layers)
        else:
            raise UserError(f"--stages {k} needs an nn.Sequential model (or a list of stages), got "
                            f"{type(model).__name__}; build the model as nn.Sequential to split it")
        if len(counts) != k or sum(counts) != len(layers) or min(counts) < 1:
            raise UserError(f"stage split {tuple(counts)} does not cut {len(layers)} layers into {k} "
                            "non-empty stages")
        self.devices = list(devices)
        self.micro_batches = micro_batches
        self.stage_names: list[list[str]] = []
        start = 0
        for count, device in zip(counts, self.devices, strict=True):
            names = [name for name, _ in layers[start:start + count]]
            for name, layer in layers[start:start + count]:
                self.add_module(name, layer.to(device))
            self.stage_names.append(names)
            start += count

    def _run_stage(self, stage: int, x: torch.Tensor) -> torch.Tensor:
        # The activation crosses to this stage's device: a copy between GPUs, a no-op on CPU.
        x = x.to(self.devices[stage], non_blocking=True)
        for name in self.stage_names[stage]:
            x = self._modules[name](x)  # type: ignore[misc]
        return x

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        chunks = list(inputs.chunk(self.micro_batches)) if self.micro_batches > 1 else [inputs]
        k = len(self.devices)
        acts: list[torch.Tensor] = list(chunks)
        # Fill/drain: tick t runs stage s on micro-batch t - s. Stage s reads what stage s-1 wrote at tick t-1.
        for tick in range(len(chunks) + k - 1):
            for stage in range(k):
                micro = tick - stage
                if 0 <= micro < len(chunks):
                    acts[micro] = self._run_stage(stage, acts[micro])
        return torch.cat(acts).to(inputs.device)


def place(model: nn.Module, device: torch.device, *, stages: int, split: Sequence[int] = (),
          micro_batches: int = 1) -> nn.Module:
    """The model on this worker's device(s): moved as a whole when stages == 1, else a Pipeline.

    `device` is the first stage's device (the trainer's `pick_device`, from `assign_devices`).
    """
    if isinstance(model, Pipeline):
        return model  # placed by the caller
    if isinstance(model, nn.ModuleList):
        stages = len(model)
    if stages == 1:
        return model.to(device)
    visible = torch.cuda.device_count() if device.type == "cuda" else 0
    devices = stage_devices(device, stages, visible)
    return Pipeline(model, devices, split=split, micro_batches=micro_batches)
