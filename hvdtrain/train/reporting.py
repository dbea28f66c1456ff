"""The metrics component: each rank's metric sums reduced across the ranks (with the stop request, in one
allreduce), rank 0's records (metrics.jsonl, tracker, console), the History and the summary. Built from its own
settings section of the config."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hvdtrain.checkpoint.rng_state import rng_preserved
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import collectives, runtime
from hvdtrain.output.console import console
from hvdtrain.output.history import History
from hvdtrain.output.run_directory import RunDirectory
from hvdtrain.train.batch import to_device
from hvdtrain.train.early_stopping import patience_exhausted
from hvdtrain.train.evaluation import param_digest
from hvdtrain.train.metrics import Metric, MetricSet, choose
from hvdtrain.train.progress import Progress
from hvdtrain.train.signals import STOP, STOP_SIGNALS, agreed_signal, stop_flags


@dataclass(frozen=True)
class MetricsSettings:
    """What the metrics component reads of the config."""

    names: tuple[str, ...]  # --metrics, split ("auto" picks by the targets)
    monitor: str            # --monitor: '' = no best weights, no early stopping
    patience: int           # --patience

    @classmethod
    def of(cls, config: TrainConfig) -> MetricsSettings:
        return cls(tuple(m.strip() for m in config.metrics.split(",") if m.strip()), config.monitor, config.patience)


class Reporter:
    """Args:
        settings: MetricsSettings.of(config).
        metrics: the metrics' layout (train/metrics.py), chosen from the first batch.
        run: the run directory rank 0 writes its records to.
    """

    def __init__(self, settings: MetricsSettings, metrics: MetricSet, run: RunDirectory) -> None:
        self.settings, self.metrics, self.run = settings, metrics, run
        self.history = History()
        self.resumed = False        # from a checkpoint: its epoch records may repeat some in metrics.jsonl
        self.samples_this_fit = 0   # trained by all ranks in the current fit() call (its samples/s)
        # --max-grad-norm: each applied step's norm before clipping (train/optimizer_step.py appends; equal on
        # every rank, computed from the averaged gradients, so no reduce), logged as grad_norm per log interval.
        self.grad_norms: list[torch.Tensor] = []

    def zeros(self) -> torch.Tensor:
        return self.metrics.zeros()

    def reduce(self, p: Progress, name: str, seen: int = 0) -> tuple[torch.Tensor, int, int]:
        """Horovod: ONE allreduce of this rank's sums, its stop request and its samples seen.
        Returns (summed metric sums, the signal all ranks agree on, samples seen by all)."""
        size = self.metrics.size
        extra = torch.tensor([*stop_flags(STOP.signum), float(seen)], dtype=torch.float64)
        total = collectives.allreduce_sum(torch.cat([p.stats, extra]), name=name)
        flags = len(STOP_SIGNALS)
        return total[:size], agreed_signal(total[size:size + flags].tolist()), int(total[size + flags].item())

    def log_interval(self, p: Progress, lr: float) -> int:
        """The train record of the last log interval; returns the stop signal all ranks agree on (0: none)."""
        total, signum, _ = self.reduce(p, "train_stats")   # one allreduce per log interval, not per step
        values = self.metrics.values(total)
        norms, self.grad_norms[:] = self.grad_norms[:], []   # emptied in place: OptimizerStep holds this list
        grad_norm = {"grad_norm": float(torch.stack(norms).double().mean())} if norms else {}
        if self.run.log:
            self.run.log.metrics({"kind": "train", "epoch": p.epoch, "step": p.step, "lr": lr, **values, **grad_norm})
        console.advance_postfix(values["loss"])
        return signum

    def end_epoch(self, p: Progress, lr: float, seconds: float, steps: int, seen: int,
                  evaluated: dict[str, Any]) -> int:
        """The epoch's record (train sums reduced, `evaluated`: the held-out metrics); returns the stop signal."""
        total, signum, seen_all = self.reduce(p, "epoch_stats", seen)
        self.gather_system()
        self.samples_this_fit += seen_all
        record = {"kind": "epoch", "epoch": p.epoch, "step": p.step, "lr": lr,
                  **self.metrics.values(total, prefix="train_"), "train_samples": int(total[1].item()),
                  **evaluated,
                  # samples trained in this process's run of the epoch: not those restored from a checkpoint
                  "samples_per_s": seen_all / seconds if seconds else 0.0, "epoch_time_s": seconds,
                  "step_time_s": seconds / steps if steps else None}
        redone = bool(self.history) and self.history[-1]["epoch"] == record["epoch"]
        if redone or self.resumed:
            record["resumed"] = True   # metrics.jsonl may hold this epoch already: readers keep the last
        if redone:
            self.history[-1] = record  # elastic: the epoch's end was redone after a failure
        else:
            self.history.append(record)
        if self.run.log:
            self.run.log.metrics(record)
        console.epoch_row(record, header=len(self.history) == 1)
        return signum

    def gather_system(self) -> None:
        """Horovod: every host's system samples since the last call reach rank 0, which alone holds the run
        (one small allgather an epoch; other hosts may not even reach its store)."""
        if not (self.run.verdict and self.run.verdict.system_hosts):
            return
        per_rank = collectives.allgather_object(self.run.host_samples(), name="system_samples")
        self.run.record_system([sample for samples in per_rank for sample in samples])

    def finish(self, p: Progress, wall: float, model: nn.Module, world: runtime.World) -> None:
        """The summary (the last epoch's metrics, throughput, every rank's steps and weights' digest)."""
        self.gather_system()   # the samples since the last epoch's end
        # Horovod: proof that every replica took the same steps and ended with the same weights.
        per_rank = collectives.allgather_object((p.step, param_digest(model)), name="final_state")
        last = self.history[-1] if self.history else {}
        summary = {**last, "kind": "summary", "epochs_run": len(self.history), "steps": p.step,
                   "skipped_steps": p.skipped, "workers": world.size,
                   "samples_per_s": self.samples_this_fit / wall,
                   "wall_time_s": wall, "rank_steps": [s for s, _ in per_rank],
                   "param_digests": [d for _, d in per_rank], "run_dir": self.run.path}
        if self.settings.monitor:
            summary.update(monitor=self.settings.monitor, best=p.best, best_epoch=p.best_epoch,
                           stopped_early=patience_exhausted(p.epoch, p.best_epoch, self.settings.patience))
        self.history.summary = summary
        if self.run.log:
            self.run.log.finish(self.history, model)
        console.done(summary)


def first_batch_layout(settings: MetricsSettings, metrics: Sequence[str | Metric] | None, model: nn.Module,
                       batch: Any, device: torch.device, run_step: Callable[[nn.Module, Any], Any],
                       autocast: AbstractContextManager[Any], default_step: bool) -> MetricSet:
    """One step on a small batch, before anything is written: an unsupported batch, output, loss or metric is a
    one-line UserError on every rank alike. Returns the metrics' layout (`metrics`, else --metrics)."""
    with rng_preserved(), torch.no_grad(), autocast:
        model.eval()
        try:
            out = run_step(model, to_device(batch, device))
        finally:
            model.train()
    names = list(settings.names) if metrics is None else list(metrics)
    layout = choose(names, out.outputs, out.targets, sorted(out.extras), default_step=default_step)
    layout.check_monitor(settings.monitor)
    return layout
