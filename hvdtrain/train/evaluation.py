"""Evaluation and prediction sharded across workers: rank r takes samples r, r+size, ... (unpadded, so
every held-out sample counts exactly once), and results come back in the data's order."""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset, default_collate

from hvdtrain.data.sharding import eval_shard
from hvdtrain.data.user_loader import unwrap
from hvdtrain.distributed import collectives, runtime
from hvdtrain.errors import UserError, first_line
from hvdtrain.train.batch import describe, first_tensor, to_device
from hvdtrain.train.metrics import MetricSet
from hvdtrain.train.step import LABEL_KEYS, LossFn, StepFn, model_inputs, run_step

Collate = Callable[[list[Any]], Any]


def probe_batch(data: Any, n: int, collate: Collate | None = None) -> Any:
    """A batch of the first `n` samples of `data` (map-style or a stream), collated as the loader will;
    a UserError naming the fix when they cannot be batched."""
    if isinstance(data, IterableDataset):
        items = list(itertools.islice(iter(data), n))
    else:
        items = [data[i] for i in range(min(n, len(data)))]
    try:
        return (collate or default_collate)(items)
    except Exception as err:
        raise UserError(uncollatable(items, collate, err)) from None


def _holds_image(value: Any, depth: int = 0) -> bool:
    if type(value).__module__.startswith("PIL."):
        return True
    if depth < 2 and isinstance(value, (list, tuple)):
        return any(_holds_image(v, depth + 1) for v in value)
    if depth < 2 and isinstance(value, Mapping):
        return any(_holds_image(v, depth + 1) for v in value.values())
    return False


def uncollatable(items: list[Any], collate: Collate | None, err: Exception) -> str:
    """Why the first samples do not make a batch, and the fix."""
    sample = describe(items[0]) if items else "nothing"
    if any(_holds_image(item) for item in items):
        return (f"the samples hold PIL images ({sample}), which cannot be batched: add a transform that makes "
                "tensors to the dataset, e.g. transform=torchvision.transforms.ToTensor() (or PILToTensor())")
    if collate is not None:
        name = getattr(collate, "__qualname__", type(collate).__name__)
        return (f"collate_fn {name} failed on the first {len(items)} samples ({sample}): "
                f"{type(err).__name__}: {first_line(err)}")
    return (f"torch's default collate cannot batch samples of {sample} ({first_line(err)}); pass a collate_fn "
            "(to the Trainer, or in your DataLoader) that turns a list of samples into a batch, e.g. one that pads")


@torch.no_grad()
def evaluate(model: nn.Module, data: Any, loss_fn: LossFn, step_fn: StepFn | None, metrics: MetricSet,
             world: runtime.World, batch_size: int, device: torch.device,
             collate: Collate | None = None) -> dict[str, Any]:
    """val_loss and every metric over all of `data`, each sample counted exactly once across ranks."""
    was_training = model.training
    model.eval()
    sums = metrics.zeros(device)
    shard = Subset(data, eval_shard(len(data), world.rank, world.size))
    # Its own generator: a DataLoader without one draws its seed from the global RNG, so an evaluation at a
    # mid-epoch stop would move training's random draws away from those of a run that did not stop there.
    for batch in DataLoader(shard, batch_size=batch_size, collate_fn=collate, generator=torch.Generator()):
        out = run_step(model, to_device(batch, device), loss_fn, step_fn)
        sums += metrics.batch_sums(out.loss, out.n, out.extras, out.outputs, out.targets)
    # Horovod: sums, not averages, so unequal shards weigh correctly.
    total = collectives.allreduce_sum(sums.cpu(), name="eval_stats")
    model.train(was_training)
    return {**metrics.values(total, prefix="val_"), "val_samples": int(total[1].item())}


@torch.no_grad()
def predict_shard(model: nn.Module, data: Any, rank: int, size: int, batch_size: int,
                  device: torch.device, collate: Collate | None = None) -> torch.Tensor:
    """Outputs for samples rank, rank+size, ... of `data`: items are (inputs, target) pairs, inputs, or
    dicts for model(**batch) (their labels left out)."""
    was_training = model.training
    model.eval()
    chunks = []
    for batch in DataLoader(Subset(data, eval_shard(len(data), rank, size)), batch_size=batch_size,
                            collate_fn=collate):
        batch = to_device(batch, device)
        if isinstance(batch, Mapping):
            output = first_tensor(model(**{k: v for k, v in model_inputs(model, batch).items()
                                           if k not in LABEL_KEYS}))
        else:
            output = first_tensor(model(batch[0] if isinstance(batch, (list, tuple)) and len(batch) == 2
                                        else batch))
        assert output is not None, "the model returned no tensor"
        # To CPU: the gather pickles, and a pickled CUDA tensor would unpickle onto that GPU index on every rank.
        chunks.append(output.cpu())
    model.train(was_training)
    return torch.cat(chunks) if chunks else torch.empty(0)


def interleave(shards: list[torch.Tensor]) -> torch.Tensor:
    """Shard r holds samples r, r+size, ...: put every sample back at its index."""
    total = sum(len(s) for s in shards)
    template = next((s for s in shards if len(s)), shards[0])
    out = torch.empty(total, *template.shape[1:], dtype=template.dtype)
    for rank, shard in enumerate(shards):
        if len(shard):
            out[rank::len(shards)] = shard
    return out


def predict(model: nn.Module, data: Any, world: runtime.World, batch_size: int, device: torch.device,
            collate: Collate | None = None) -> torch.Tensor:
    """Outputs for every sample of `data` in its original order, on every rank."""
    local = predict_shard(model, data, world.rank, world.size, batch_size, device, collate)
    # Horovod: shards differ in length, so gather as objects; rank r holds samples r, r+size, ...
    return interleave(collectives.allgather_object(local, name="predict"))


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        # The bytes, whatever the dtype (numpy has no bfloat16).
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def held_out(data: Any, what: str, batch_size: int, collate: Collate | None) -> tuple[Any, int, Collate | None]:
    """A Dataset or DataLoader to evaluate or predict on: the DataLoader's own batch size and collate_fn where it
    has them, else `batch_size` and `collate`."""
    data, loading = unwrap(data, what)
    own = loading.collate_fn if loading and loading.collate_fn else collate
    return data, loading.batch_size if loading else batch_size, own
