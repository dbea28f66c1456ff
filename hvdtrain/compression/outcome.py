"""What every compression method hands back, and the two things they share: a follow-up training's config
and rank 0's progress lines."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.environment import process
from hvdtrain.output.console import console


@dataclass
class Outcome:
    """What a method produced: the compressed model, its config, and what goes into the report."""
    name: str
    model: nn.Module
    config: TrainConfig
    details: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    extra: list[tuple[str, nn.Module]] = field(default_factory=list)  # more rows (distill: the baseline)


def follow_up_config(config: TrainConfig, **changes: Any) -> TrainConfig:
    """The source run's config for a follow-up training that writes no run directory of its own."""
    plain = {"run_dir": "", "name": "", "resume": "", "monitor": "", "patience": 0, "elastic": False,
             "stages": 1, "stage_split": (), "micro_batches": 1}
    return load_config(**{**config.to_dict(), **plain, **changes})


def say(opts: CompressOptions, text: str) -> None:
    """A progress line, from rank 0 only (every rank runs the same steps)."""
    if opts.verbose and process.is_rank_zero():
        console.line(f"hvdtrain compress: {text}")
