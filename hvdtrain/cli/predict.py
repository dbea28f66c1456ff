"""`hvdtrain predict`: a trained model's outputs for a dataset, sharded across Horovod ranks or a process pool.

Under `horovodrun -np N` rank r computes samples r, r+N, ... (uneven shards are fine) and rank 0 writes
one file in the original order. Without a launcher, `--procs N` splits the same way across a
torch.multiprocessing pool on this machine.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from hvdtrain.cli.args import Parser
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write
from hvdtrain.train import checkpoint
from hvdtrain.train.device import threads_per_worker
from hvdtrain.train.evaluation import interleave, predict_shard

SPLITS = ("val", "train")


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = Parser("hvdtrain predict", __doc__)
    parser.add_argument("--checkpoint", required=True,
                        help="runs/NAME/checkpoints/ckpt-STEP.pt, runs/NAME/model.pt (config.yaml beside it), or a "
                             "compressed model: runs/NAME-int8/model.pt2 or that run directory")
    parser.add_argument("--out", required=True, help="output file: .pt (a tensor) or .npy")
    parser.add_argument("--dataset", default="", help="dataset to predict on (default: the one trained on)")
    parser.add_argument("--split", default="val", choices=SPLITS, help="which split of the dataset")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per forward pass")
    parser.add_argument("--procs", type=int, default=0,
                        help="a torch.multiprocessing pool of N processes on this machine instead of Horovod")
    parsed = parser.parse_args(args)
    if parsed.batch_size <= 0 or parsed.procs < 0:
        raise UserError("predict: --batch-size must be > 0 and --procs >= 0")
    if Path(parsed.out).suffix not in (".pt", ".npy"):
        raise UserError(f"predict: --out {parsed.out} must end in .pt or .npy")
    return parsed


def load_trained(path: str) -> tuple[dict[str, torch.Tensor] | Path, TrainConfig]:
    """The weights and training config of a checkpoint, or of a model.pt with config.yaml beside it.

    A compressed model (`hvdtrain compress`) is a torch.export program, model.pt2, given as the file or its
    run directory: then the first value is its path, loaded by each process that predicts.
    """
    file = Path(path)
    if file.is_dir():
        file = file / "model.pt2" if (file / "model.pt2").is_file() else file / "model.pt"
        path = str(file)
    if file.suffix == ".pt2" and file.is_file():
        if not (file.parent / "config.yaml").is_file():
            raise UserError(f"{file} has no config.yaml beside it to name the dataset")
        return file, load_config(str(file.parent / "config.yaml"))
    weights, saved_config = checkpoint.read_weights(Path(path))
    if saved_config is not None:
        return weights, load_config(**saved_config)
    config_file = Path(path).parent / "config.yaml"
    if not config_file.is_file():
        raise UserError(f"{path} holds weights only and there is no {config_file} to rebuild the model from")
    return weights, load_config(str(config_file))


def predict_split(state: dict[str, torch.Tensor] | Path, config: TrainConfig, split: str, rank: int, size: int,
                  batch_size: int) -> torch.Tensor:
    """Outputs for samples rank, rank+size, ... of the split (a pure function of its arguments)."""
    data = build_data(config)
    dataset = data.train if split == "train" else data.val
    model: torch.nn.Module
    if isinstance(state, Path):  # a compressed model, exported whole: no architecture to rebuild
        from hvdtrain.compression.export import load_exported

        model = load_exported(state)
    else:
        torch.manual_seed(config.seed)
        model = build_model(config, input_shape(dataset), data.num_classes)
        model.load_state_dict(state)
    return predict_shard(model, dataset, rank, size, batch_size, torch.device("cpu"))


def _pool_worker(job: tuple[Any, ...]) -> Any:
    state, config, split, rank, size, batch_size, threads = job
    torch.set_num_threads(threads)
    return predict_split(state, config, split, rank, size, batch_size).numpy()


def _pool_predict(state: dict[str, torch.Tensor] | Path, config: TrainConfig, split: str, procs: int,
                  batch_size: int) -> torch.Tensor:
    import torch.multiprocessing as mp

    jobs = [(state, config, split, rank, procs, batch_size, threads_per_worker(procs)) for rank in range(procs)]
    # spawn: a clean interpreter per process, safe whatever this one has initialised.
    with mp.get_context("spawn").Pool(procs) as pool:
        shards = pool.map(_pool_worker, jobs)
    return interleave([torch.from_numpy(s) for s in shards])


def _write(outputs: torch.Tensor, out: str) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        import numpy as np

        atomic_write(path, lambda handle: np.save(handle, outputs.numpy()))
    else:
        atomic_write(path, lambda handle: torch.save(outputs, handle))


def main(args: list[str]) -> int:
    opts = parse_args(args)
    state, config = load_trained(opts.checkpoint)
    if opts.dataset:
        config = load_config(**{**config.to_dict(), "dataset": opts.dataset})
    if opts.procs:
        outputs = _pool_predict(state, config, opts.split, opts.procs, opts.batch_size)
        _write(outputs, opts.out)
        console.line(f"hvdtrain: wrote {len(outputs)} predictions to {opts.out} ({opts.procs} processes)")
        return 0
    from hvdtrain.distributed import dist

    world = dist.init()
    console.set_rank(world.rank)
    local = predict_split(state, config, opts.split, world.rank, world.size, opts.batch_size)
    # Horovod: shards differ in length (1001 over 3 ranks), so gather them as objects.
    shards = dist.allgather_object(local, name="predict_cli")
    if world.is_root:
        outputs = interleave(shards)
        _write(outputs, opts.out)
        console.line(f"hvdtrain: wrote {len(outputs)} predictions to {opts.out} ({world.size} rank(s))")
    return 0
