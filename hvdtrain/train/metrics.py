"""Metrics that stay correct across workers: every metric is a vector of sums.

Each batch adds its sums (no host sync); the sums of all metrics, the loss and the sample count
travel in ONE float64 tensor, reduced with one Horovod allreduce per log interval and per
evaluation. Sums (not averages) make unequal shards weigh correctly: the reduced value equals the
single-process value exactly.

A metric is any object with `name`, `size`, `higher_is_better`, `sums(outputs, targets)` and
`value(sums)`; `hvdtrain.train.metrics.batch_mean(name, fn)` turns a per-batch mean function into one.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hvdtrain.errors import UserError

F64 = torch.float64

# One batch's (mean loss, samples, step_fn values, each metric's sums): MetricSet.batch_parts.
BatchParts = tuple[torch.Tensor, int, list[torch.Tensor], list[torch.Tensor]]


class Metric(Protocol):
    @property
    def name(self) -> str:
        """Reported as NAME (training) and val_NAME (held-out)."""
        ...

    @property
    def size(self) -> int:
        """How many sums it keeps."""
        ...

    @property
    def higher_is_better(self) -> bool:
        ...

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """float64 tensor of `size` sums for this batch (on the batch's device; no .item())."""
        ...

    def value(self, sums: torch.Tensor) -> float | None:
        """The metric from sums over any number of batches and workers; None when undefined."""
        ...


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> float | None:
    if float(denominator) == 0:
        return None
    value = float(numerator / denominator)
    return None if value != value else value


@dataclass(frozen=True)
class TopK:
    """Share of samples whose label is among the k highest outputs (k=1: accuracy)."""
    k: int = 1
    size: int = 2
    higher_is_better: bool = True

    @property
    def name(self) -> str:
        return "acc" if self.k == 1 else f"top{self.k}_acc"

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.k == 1:
            hits = (outputs.argmax(1) == targets).sum()
        else:
            hits = (outputs.topk(self.k, dim=1).indices == targets.unsqueeze(1)).any(1).sum()
        return torch.stack([hits.to(F64), torch.tensor(float(targets.shape[0]), dtype=F64, device=outputs.device)])

    def value(self, sums: torch.Tensor) -> float | None:
        return _ratio(sums[0], sums[1])


@dataclass(frozen=True)
class ErrorMean:
    """Mean squared (power 2) or absolute (power 1) error over every element."""
    name: str
    power: int
    size: int = 2
    higher_is_better: bool = False

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        diff = (outputs.detach().to(F64) - targets.to(F64).reshape(outputs.shape))
        total = (diff * diff).sum() if self.power == 2 else diff.abs().sum()
        return torch.stack([total, torch.tensor(float(diff.numel()), dtype=F64, device=outputs.device)])

    def value(self, sums: torch.Tensor) -> float | None:
        return _ratio(sums[0], sums[1])


@dataclass(frozen=True)
class BatchMean:
    """A user function giving a per-batch mean, weighted by the batch's samples."""
    name: str
    fn: Callable[[torch.Tensor, torch.Tensor], Any]
    higher_is_better: bool = True
    size: int = 2

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = float(targets.shape[0])
        mean = torch.as_tensor(self.fn(outputs, targets), dtype=F64, device=outputs.device)
        return torch.stack([mean.reshape(()) * n, torch.tensor(n, dtype=F64, device=outputs.device)])

    def value(self, sums: torch.Tensor) -> float | None:
        return _ratio(sums[0], sums[1])


def batch_mean(name: str, fn: Callable[[torch.Tensor, torch.Tensor], Any], higher_is_better: bool = True) -> Metric:
    """A metric from `fn(outputs, targets) -> mean over the batch`.

    Example:
        >>> f1ish = batch_mean("pos_rate", lambda out, y: (out.argmax(1) == 1).float().mean())
        >>> hvdtrain.Trainer(model, train, val, metrics=["acc", f1ish])
    """
    return BatchMean(name, fn, higher_is_better)


def by_name(name: str) -> Metric:
    """acc, topK_acc (e.g. top5_acc), mse, mae."""
    if name == "acc":
        return TopK(1)
    if match := re.fullmatch(r"top(\d+)_acc", name):
        return TopK(int(match.group(1)))
    if name in ("mse", "mae"):
        return ErrorMean(name, 2 if name == "mse" else 1)
    raise UserError(f"unknown metric '{name}'; built-ins are acc, topK_acc (e.g. top5_acc), mse, mae, "
                    "or pass a metric object from Python (metrics=[...])")


def auto_metrics(outputs: torch.Tensor | None, targets: Any) -> list[Metric]:
    """What fits the task: accuracy for class labels, MSE and MAE for real-valued targets, else none."""
    if outputs is None or not isinstance(targets, torch.Tensor):
        return []
    if outputs.dim() == 2 and targets.dim() == 1 and not targets.is_floating_point():
        return [TopK(1)]
    if targets.is_floating_point() and targets.numel() == outputs.numel():
        return [ErrorMean("mse", 2), ErrorMean("mae", 1)]
    return []


class MetricSet:
    """The layout of the one stats tensor: [loss sum, samples, step_fn values x samples..., metric sums...].

    Args:
        metrics: metric objects (from the outputs and targets of the default step).
        extras: names of the values a step_fn returns beside its loss (batch means).
    """

    def __init__(self, metrics: Sequence[Metric], extras: Sequence[str] = ()) -> None:
        names = ["loss", *extras, *(m.name for m in metrics)]
        if len(set(names)) != len(names):
            raise UserError(f"metric names must be unique, got {names}")
        self.metrics, self.extras = list(metrics), list(extras)
        self.size = 2 + len(self.extras) + sum(m.size for m in self.metrics)

    @property
    def names(self) -> list[str]:
        return ["loss", *self.extras, *(m.name for m in self.metrics)]

    def zeros(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(self.size, dtype=F64, device=device)

    def batch_sums(self, loss: torch.Tensor, n: int, extras: dict[str, torch.Tensor],
                   outputs: torch.Tensor | None, targets: Any) -> torch.Tensor:
        """This batch's row of sums; tensors stay on the device (no host sync)."""
        device = loss.device
        count = torch.tensor(float(n), dtype=F64, device=device)
        parts = [loss.detach().to(F64).reshape(1) * n, count.reshape(1)]
        parts += [torch.as_tensor(extras[name], device=device).detach().to(F64).reshape(1) * n
                  for name in self.extras]
        if self.metrics:
            assert outputs is not None
            detached = outputs.detach()
            parts += [m.sums(detached, targets).reshape(m.size) for m in self.metrics]
        return torch.cat(parts)

    def batch_parts(self, loss: torch.Tensor, n: int, extras: dict[str, Any], outputs: torch.Tensor | None,
                    targets: Any) -> BatchParts:
        """A training batch's sums, not yet added up: add_parts adds a log interval's batches in a few ops.

        batch_sums costs ~15 small tensor ops a batch, and right after a large step each one is slow
        (~10 us with cold caches): ~0.2 ms of an MLP's 9 ms step (benchmarks/README.md, overhead)."""
        metric_sums = []
        if self.metrics:
            assert outputs is not None
            detached = outputs.detach()
            metric_sums = [m.sums(detached, targets) for m in self.metrics]
        # Detached: a kept tensor must not keep its step's autograd graph alive until the next log interval.
        return (loss.detach(), n, [torch.as_tensor(extras[name], device=loss.device).detach() for name in self.extras],
                metric_sums)

    def add_parts(self, stats: torch.Tensor, parts: list[BatchParts]) -> torch.Tensor:
        """stats (CPU) plus the sums of these batches, as batch_sums would have added them one by one."""
        if not parts:
            return stats
        device = parts[0][0].device
        counts = torch.tensor([float(n) for _, n, _, _ in parts], dtype=F64, device=device)
        means = [torch.stack([loss.reshape(()) for loss, _, _, _ in parts]).to(F64)]
        means += [torch.stack([extras[i].reshape(()) for _, _, extras, _ in parts]).to(F64)
                  for i in range(len(self.extras))]
        weighted = (torch.stack(means) * counts).sum(1)
        metric_totals = [torch.stack([sums[j] for _, _, _, sums in parts]).reshape(len(parts), m.size).to(F64).sum(0)
                         for j, m in enumerate(self.metrics)]
        total = torch.cat([weighted[:1], counts.sum().reshape(1), weighted[1:], *metric_totals])
        return stats + total.cpu()

    def values(self, total: torch.Tensor, prefix: str = "") -> dict[str, float | None]:
        """Sums (reduced over batches and workers) -> {prefix+name: value}."""
        count = total[1]
        out = {f"{prefix}loss": _ratio(total[0], count)}
        at = 2
        for name in self.extras:
            out[f"{prefix}{name}"] = _ratio(total[at], count)
            at += 1
        for metric in self.metrics:
            out[f"{prefix}{metric.name}"] = metric.value(total[at:at + metric.size])
            at += metric.size
        return out

    def check_monitor(self, monitor: str) -> None:
        """--monitor must name a held-out value of this run."""
        known = [f"val_{name}" for name in self.names]
        if monitor and monitor not in known:
            raise UserError(f"monitor {monitor} is not a held-out metric of this run; choose one of {', '.join(known)}")

    def higher_is_better(self, name: str) -> bool:
        """Direction of a monitored metric (val_NAME or NAME); loss-like step_fn values improve downwards."""
        bare = name.removeprefix("val_")
        for metric in self.metrics:
            if metric.name == bare:
                return metric.higher_is_better
        return not (bare == "loss" or "loss" in bare or "err" in bare)


def choose(items: Sequence[str | Metric], outputs: torch.Tensor | None, targets: Any, extras: Sequence[str], *,
           default_step: bool) -> MetricSet:
    """The run's metrics from names/objects ("auto" = by task), each checked on the first batch's outputs.

    Args:
        outputs, targets: what the default step produced on a probe batch (outputs None with step_fn).
        extras: names of the values step_fn returns beside its loss.
    """
    chosen: list[Metric] = []
    for item in items:
        if item == "auto":
            chosen += auto_metrics(outputs, targets) if default_step else []
        else:
            chosen.append(by_name(item) if isinstance(item, str) else item)
    for metric in chosen:
        if outputs is None:
            raise UserError(f"metric {metric.name} needs the default step's outputs and targets; with "
                            "step_fn, return it as a value: (loss, {'" + metric.name + "': value})")
        try:
            metric.sums(outputs.detach(), targets)
        except Exception as err:
            raise UserError(f"metric {metric.name} does not fit outputs {tuple(outputs.shape)} and targets "
                            f"{getattr(targets, 'shape', type(targets).__name__)}: {err}; choose others with "
                            "--metrics") from None
    return MetricSet(chosen, extras)
