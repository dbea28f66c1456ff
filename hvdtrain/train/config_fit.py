"""A job named by its config alone (`python -m hvdtrain`, `hvdtrain.fit`): the built-in or plug-in model and data,
then the Trainer."""
from __future__ import annotations

import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.models.builtin import build_model
from hvdtrain.output.history import History
from hvdtrain.output.run_directory import RunDirectory, RunDirSettings
from hvdtrain.train.loop_run import ElasticRun, LocalRun
from hvdtrain.train.run_start import started
from hvdtrain.train.trainer import Trainer


def fit(config: TrainConfig, *, handle_signals: bool = True) -> History:
    """Train the model and dataset named in `config` (built-ins or plug-ins) on every worker.

    Args:
        config: a TrainConfig, e.g. `hvdtrain.load_config("run.yaml", epochs=3)`.
        handle_signals: as the Trainer's (False in a notebook).
    Returns:
        The History: per-epoch metrics, `.summary` (final metrics, throughput, run dir), `.plot()`.
    Example:
        >>> history = hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=5))
    """
    torch.manual_seed(config.seed)
    # A run refused its folder stops before loading anything; a run that fails before writing leaves no folder.
    with started(config, handle_signals) as (config, world), RunDirectory(RunDirSettings.of(config)) as run:
        (ElasticRun if config.elastic else LocalRun).claim_early(run, is_root=world.is_root)
        data = build_data(config)
        model = build_model(config, input_shape(data.train), data.num_classes)
        with Trainer(model, data.train, data.val, config=config, run_directory=run) as trainer:
            return trainer.fit()
