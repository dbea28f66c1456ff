"""Knowledge distillation: a small student learns from a trained teacher's softened outputs (Hinton et al.).

The teacher runs once, before training: its logits ride in each training target beside the label
(a float row `[label, logit_0, ..., logit_C-1]`), so the normal Trainer, its sharding and its
allreduces train the student unchanged. Held-out targets stay plain labels, so the Trainer's
evaluation reports accuracy as usual.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from hvdtrain.errors import UserError
from hvdtrain.train.metrics import TopK


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
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise UserError(f"student {name} does not fit the data: inputs of shape {tuple(sample.shape)} fail in its "
                        f"forward ({type(err).__name__}: {first})") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"student {name} does not fit the data: it returns {shape} for one sample, expected "
                        f"(1, {num_classes}) (one logit per class)")
    student.train()
