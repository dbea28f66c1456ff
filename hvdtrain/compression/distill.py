"""Knowledge distillation: a small student learns from a trained teacher's softened outputs (Hinton et al.).

The teacher runs once, before training: its logits ride in each training target beside the label
(a float row `[label, logit_0, ..., logit_C-1]`), so the normal Trainer, its sharding and its
allreduces train the student unchanged. Held-out targets stay plain labels, so the Trainer's
evaluation reports accuracy as usual.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from hvdtrain.compression import measure
from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.compression.outcome import Outcome, follow_up_config, say
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError, first_line
from hvdtrain.models.builtin import build_model
from hvdtrain.train.metrics import TopK
from hvdtrain.trained.finished_run import FinishedRun


def labels_of(targets: torch.Tensor) -> torch.Tensor:
    """Class labels from plain labels [N] or distillation rows [N, 1 + C] (the label first)."""
    return targets if targets.dim() == 1 else targets[:, 0].long()


@dataclass(frozen=True)
class LabelAccuracy:
    """The Trainer's accuracy metric for distillation: the same on soft-target rows and on plain labels."""
    name: str = "acc"
    size: int = 2
    higher_is_better: bool = True

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return TopK(1).sums(outputs, labels_of(targets))

    def value(self, sums: torch.Tensor) -> float | None:
        return TopK(1).value(sums)


class DistillLoss:
    """alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * cross-entropy(student, label).

    Targets of shape [N, 1 + C] carry the label and the teacher's logits; plain [N] labels (held-out
    data) get the cross-entropy alone, so evaluation reports the usual loss and accuracy.

    Args:
        temperature: T > 0; higher spreads the teacher's probability over more classes.
        alpha: weight of the soft-target term, 0 <= alpha <= 1.
    Example:
        >>> loss = DistillLoss(4.0, 0.7)(student_logits, soft_targets)
    """

    def __init__(self, temperature: float, alpha: float) -> None:
        self.temperature = temperature
        self.alpha = alpha

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.dim() == 1:
            return F.cross_entropy(outputs, targets)
        labels, teacher = labels_of(targets), targets[:, 1:]
        t = self.temperature
        # T^2 keeps the soft term's gradients on the scale of the hard term's (Hinton et al., 2015).
        soft = F.kl_div(F.log_softmax(outputs / t, dim=1), F.log_softmax(teacher / t, dim=1),
                        reduction="batchmean", log_target=True) * (t * t)
        return self.alpha * soft + (1.0 - self.alpha) * F.cross_entropy(outputs, labels)


@torch.no_grad()
def soft_targets(teacher: nn.Module, dataset: Any, batch_size: int = 256) -> TensorDataset:
    """The training set with each label joined by the teacher's logits: (input, [label, logits...]).

    Every rank computes the same rows (the teacher is deterministic), so no communication is needed.
    """
    teacher.eval()
    inputs, rows = [], []
    for batch, labels in DataLoader(dataset, batch_size=batch_size):
        inputs.append(batch)
        rows.append(torch.cat([labels.float()[:, None], teacher(batch).float()], dim=1))
    return TensorDataset(torch.cat(inputs), torch.cat(rows))


def check_student(student: nn.Module, sample: torch.Tensor, num_classes: int, name: str) -> None:
    """UserError unless the student maps a batch of this data's inputs to one logit per class."""
    try:
        with torch.no_grad():
            out = student.eval()(sample[None])
    except Exception as err:
        raise UserError(f"student {name} does not fit the data: inputs of shape {tuple(sample.shape)} fail in its "
                        f"forward ({type(err).__name__}: {first_line(err, 160)})") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"student {name} does not fit the data: it returns {shape} for one sample, expected "
                        f"(1, {num_classes}) (one logit per class)")
    student.train()


def student(run: FinishedRun, opts: CompressOptions) -> tuple[nn.Module, TrainConfig]:
    """The student and its training config, built with the seed of the run and checked against the data
    before anything trains or is written."""
    config = follow_up_config(run.config, model=opts.student, hidden=opts.student_hidden,
                              epochs=opts.epochs or run.config.epochs, lr=opts.lr or run.config.lr)
    torch.manual_seed(config.seed)
    try:
        model = build_model(config, run.input_shape, run.data.num_classes)
    except UserError as err:  # a plug-in that cannot be imported, a cnn for flat inputs, ...
        raise UserError(f"student {opts.student}: {err}") from None
    except Exception as err:
        raise UserError(f"student {opts.student} cannot be built for inputs {run.input_shape}: "
                        f"{type(err).__name__}: {first_line(err, 160)}") from None
    check_student(model, run.data.train[0][0], run.data.num_classes, opts.student)
    return model, config


def compress(run: FinishedRun, opts: CompressOptions, model: nn.Module, config: TrainConfig) -> Outcome:
    """Train `model` (from `student`) on the teacher's soft targets with the normal Trainer on every Horovod
    worker; with opts.baseline, the same student from the same weights without the teacher too."""
    from hvdtrain.train.trainer import Trainer  # Horovod only once a method trains

    initial = copy.deepcopy(model.state_dict())  # the baseline starts from the same weights
    targets = soft_targets(run.model, run.data.train)
    loss = DistillLoss(opts.temperature, opts.alpha)
    say(opts, f"distilling into {opts.student} (hidden {opts.student_hidden}, "
              f"{measure.count_params(model):,} parameters) for {config.epochs} epoch(s)")
    # The teacher's logits ride in the targets, so the Trainer's own accuracy would not recognise the labels.
    with Trainer(model, targets, run.data.val, loss_fn=loss, metrics=[LabelAccuracy()], config=config) as trainer:
        distilled = trainer.fit()
    details: dict[str, Any] = {
        "student": opts.student, "student_hidden": opts.student_hidden, "temperature": opts.temperature,
        "alpha": opts.alpha, "epochs": config.epochs, "lr": config.lr, "workers": distilled.summary.get("workers"),
        "distilled_val_acc": [r.get("val_acc") for r in distilled]}
    # The Trainer may have moved them to a GPU: export and latency timing run on CPU inputs.
    outcome = Outcome("student (distilled)", model.cpu().eval(), config, details)
    if opts.baseline:
        say(opts, "training the same student without the teacher (same epochs, LR, seed)")
        plain = copy.deepcopy(model)
        plain.load_state_dict(initial)
        with Trainer(plain, run.data.train, run.data.val, config=config) as trainer:
            baseline = trainer.fit()
        details["baseline_val_acc"] = [r.get("val_acc") for r in baseline]
        outcome.extra.append(("student (no teacher)", plain.cpu().eval()))
    return outcome
