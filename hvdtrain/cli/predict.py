"""`hvdtrain predict`: a trained model's outputs for a dataset, sharded across Horovod ranks or a process pool.

Under `horovodrun -np N` rank r computes samples r, r+N, ... (uneven shards are fine) and rank 0 writes
one file in the original order. Without a launcher, `--procs N` splits the same way across a
torch.multiprocessing pool on this machine. A run of your own model class is rebuilt from its model.json;
where that says it cannot be, `--model module:function` names a builder that returns the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.option_flags import add_options, values
from hvdtrain.config.fields import option
from hvdtrain.config.train_config import DEVICES, TrainConfig, load_config
from hvdtrain.errors import UserError

if TYPE_CHECKING:
    import torch

    from hvdtrain.environment.process import Process
    from hvdtrain.models.recipe import ModelRecipe

SPLITS = ("val", "train")


@dataclass(frozen=True)
class PredictOptions:
    checkpoint: str = option(help="runs/NAME/checkpoints/ckpt-STEP.pt, runs/NAME/model.pt (config.yaml beside it), "
                                  "or a compressed model: runs/NAME-int8/model.pt2 or that run directory",
                             metavar="FILE")
    out: str = option(help="output file: .pt (a tensor) or .npy", metavar="FILE")
    dataset: str = option("", "dataset to predict on; '' = the one trained on", metavar="NAME")
    split: str = option("val", "which split of the dataset", choices=SPLITS)
    batch_size: int = option(256, "samples per forward pass")
    procs: int = option(0, "a torch.multiprocessing pool of N CPU processes on this machine instead of Horovod; "
                           "0 = Horovod's ranks")
    device: str = option("auto", "Horovod's ranks: auto (one GPU per rank when CUDA is present), cpu or cuda; "
                                 "a compressed model and --procs run on CPU", choices=DEVICES)
    model: str = option("", "a builder 'module:function' (config, input_shape, num_classes) that returns the trained "
                            "model, for a run whose model.json says hvdtrain cannot rebuild it; '' = as the run "
                            "recorded", metavar="MODULE:FUNCTION")

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise UserError(f"predict: --batch-size must be > 0, got {self.batch_size}")
        if self.procs < 0:
            raise UserError(f"predict: --procs must be >= 0 (0 = Horovod's ranks), got {self.procs}")
        if Path(self.out).suffix not in (".pt", ".npy"):
            raise UserError(f"predict: --out {self.out} must end in .pt or .npy")
        if self.procs and self.device == "cuda":
            raise UserError(f"predict: --procs {self.procs} runs a CPU pool; for GPUs drop --procs and launch "
                            "with horovodrun -np N (one GPU per rank)")


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "predict", __doc__)
    add_options(p, PredictOptions)
    return p


def parse_args(args: list[str]) -> PredictOptions:
    return PredictOptions(**values(parser().parse_args(args), PredictOptions))


def load_trained(path: str, model: str = "") -> tuple[dict[str, torch.Tensor] | Path, TrainConfig,
                                                      ModelRecipe | None]:
    """The weights, training config and model record (model.json) of a checkpoint, or of a model.pt with
    config.yaml beside it; `model`, a builder 'module:function', replaces the record.

    A compressed model (`hvdtrain compress`) is a torch.export program, model.pt2, given as the file or its
    run directory: then the first value is its path, loaded by each process that predicts. A model that
    cannot be rebuilt is refused here (one line: why, and the fix), before any process starts.
    """
    from hvdtrain.trained import finished_run

    file = Path(path)
    if file.is_dir() and (file / "model.pt2").is_file():
        file = file / "model.pt2"
    if file.suffix == ".pt2" and file.is_file():
        if model:
            raise UserError(f"predict: {file} is a compressed model that holds its own graph; --model is for "
                            "weights (model.pt, a checkpoint)")
        return file, finished_run.read_config(file.parent), None
    state, config, weights = finished_run.read_trained(file)
    if model:
        return state, load_config(**{**config.to_dict(), "model": model}), None
    record = finished_run.model_recipe(weights)
    if record is not None:
        record.check(finished_run.run_dir_of(weights))
    return state, config, record


def predict_split(state: dict[str, torch.Tensor] | Path, config: TrainConfig, split: str, rank: int, size: int,
                  batch_size: int, device: torch.device | None = None,
                  model_record: ModelRecipe | None = None) -> torch.Tensor:
    """Outputs for samples rank, rank+size, ... of the split (a pure function of its arguments), computed on
    `device` (CPU when None) and returned on CPU; the model is rebuilt from `model_record` (model.json) when
    given, else from `config`."""
    import torch

    from hvdtrain.data.datasets import build_data
    from hvdtrain.train.evaluation import predict_shard
    from hvdtrain.trained import finished_run

    data = build_data(config)
    dataset = data.train if split == "train" else data.val
    model: torch.nn.Module
    if isinstance(state, Path):  # a compressed model, exported whole: no architecture to rebuild
        from hvdtrain.compression.export import load_exported

        model = load_exported(state)
        device = None  # int8 kernels are CPU-only, and export fixed the graph's devices
    else:
        model = finished_run.rebuild(config, state, data, model_record=model_record).to(device or "cpu")
    return predict_shard(model, dataset, rank, size, batch_size, device or torch.device("cpu"))


def rank_device(state: dict[str, torch.Tensor] | Path, choice: str, world: Process) -> torch.device:
    """A Horovod rank's device for `predict_split`: training's rule (one GPU per rank), CPU for a compressed model."""
    import torch

    from hvdtrain.train.device import pick_device

    if isinstance(state, Path):
        return torch.device("cpu")
    return pick_device(choice, world.local_rank, local_size=world.local_size)


def _pool_worker(job: tuple[Any, ...]) -> Any:
    import torch

    state, config, split, rank, size, batch_size, threads, model_record = job
    torch.set_num_threads(threads)
    return predict_split(state, config, split, rank, size, batch_size, model_record=model_record).numpy()


def _pool_predict(state: dict[str, torch.Tensor] | Path, config: TrainConfig, split: str, procs: int,
                  batch_size: int, model_record: ModelRecipe | None) -> torch.Tensor:
    import torch
    import torch.multiprocessing as mp

    from hvdtrain.train.device import threads_per_worker
    from hvdtrain.train.evaluation import interleave

    jobs = [(state, config, split, rank, procs, batch_size, threads_per_worker(procs), model_record)
            for rank in range(procs)]
    # spawn: a clean interpreter per process, safe whatever this one has initialised.
    with mp.get_context("spawn").Pool(procs) as pool:
        shards = pool.map(_pool_worker, jobs)
    return interleave([torch.from_numpy(s) for s in shards])


def _write(outputs: torch.Tensor, out: str) -> None:
    import torch

    from hvdtrain.output.files import atomic_write

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        import numpy as np

        atomic_write(path, lambda handle: np.save(handle, outputs.numpy()))
    else:
        atomic_write(path, lambda handle: torch.save(outputs, handle))


def main(args: list[str]) -> int:
    from hvdtrain.output.console import console
    from hvdtrain.train.evaluation import interleave

    opts = parse_args(args)
    state, config, record = load_trained(opts.checkpoint, opts.model)
    if opts.dataset:
        config = load_config(**{**config.to_dict(), "dataset": opts.dataset})
    if opts.procs:
        outputs = _pool_predict(state, config, opts.split, opts.procs, opts.batch_size, record)
        _write(outputs, opts.out)
        console.line(f"hvdtrain: wrote {len(outputs)} predictions to {opts.out} ({opts.procs} processes)")
        return 0
    from hvdtrain.distributed import collectives, runtime

    world = runtime.init()
    device = rank_device(state, opts.device, world)
    local = predict_split(state, config, opts.split, world.rank, world.size, opts.batch_size, device, record)
    # Horovod: shards differ in length (1001 over 3 ranks), so gather them as objects.
    shards = collectives.allgather_object(local, name="predict_cli")
    if world.is_root:
        outputs = interleave(shards)
        _write(outputs, opts.out)
        console.line(f"hvdtrain: wrote {len(outputs)} predictions to {opts.out} ({world.size} rank(s))")
    return 0
