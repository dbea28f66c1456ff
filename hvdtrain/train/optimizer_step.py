"""One optimizer step, the same on every rank: gradients synchronised, checked for non-finite values,
unscaled (fp16), clipped by their global norm (--max-grad-norm), applied or skipped on every rank alike."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hvdtrain.distributed import bucket_step, collectives, gradients
from hvdtrain.train.metrics import BatchParts
from hvdtrain.train.nonfinite import count_nonfinite, gradients_finite
from hvdtrain.train.precision import Precision
from hvdtrain.train.progress import Progress


class OptimizerStep:
    """Args:
        optimizer: Horovod's DistributedOptimizer (distributed/gradients.py wrapped it).
        model: its model (fp16's gradient check reads the gradients).
        precision: the loss scaler, if any.
        op: --op (Adasum steps inside backward); nonfinite_limit: --nonfinite-limit (0: no check);
        predivide: --gradient-predivide-factor.
        max_norm: --max-grad-norm (0: no clipping); norms: where each applied step's pre-clip norm is
            appended (a 0-dim tensor, no host sync; the Reporter logs their mean as grad_norm).
        before_step: called with every rank's gradients averaged (and unscaled), before clipping and the step
            (the callbacks' on_before_optimizer_step).
    """

    def __init__(self, optimizer: Any, model: torch.nn.Module, precision: Precision, *, op: str,
                 nonfinite_limit: int, predivide: float, max_norm: float = 0.0,
                 norms: list[torch.Tensor] | None = None, before_step: Callable[[], None] | None = None) -> None:
        self.optimizer, self.model, self.scaler = optimizer, model, precision.scaler
        self.limit, self.predivide = nonfinite_limit, predivide
        self.max_norm, self.norms, self.before_step = max_norm, norms, before_step
        self.last_norm: torch.Tensor | None = None   # the last applied step's norm before clipping
        self.steps_in_backward = gradients.steps_in_backward(op)
        # The loss decides, not a pass over every gradient (that pass cost ~5% of an MLP step; see
        # benchmarks/README.md). fp16 keeps the gradient check: an overflow there leaves the loss finite.
        self.check_loss = bool(nonfinite_limit) and not self.steps_in_backward and self.scaler is None
        # Where the loss flag rides in the first bucket (gradients.scale_before_sending), written before backward.
        self.flag_slot = getattr(optimizer, "loss_flag_slot", None) if self.check_loss else None
        self.first_bucket = getattr(optimizer, "loss_flag_bucket", None)
        # Stepping by bucket needs the verdict from the first bucket, where the loss is checked at all; and the
        # global norm (and a callback before the step) needs every bucket back, so those step once, after the last.
        self.by_bucket = (self.scaler is None and not self.steps_in_backward and not max_norm and not before_step
                          and (self.flag_slot is not None or not self.check_loss)
                          and bucket_step.can_step_by_bucket(optimizer))

    def before_backward(self, parts: list[BatchParts]) -> None:
        """The step's loss is known: write its non-finite flag where the first bucket will send it."""
        if self.flag_slot is not None:
            self.flag_slot.copy_((step_loss(parts).detach() * 0).reshape(self.flag_slot.shape))   # inf * 0 is NaN

    def apply(self, p: Progress, parts: list[BatchParts]) -> bool:
        """Apply the step's gradients, the same on every rank; False when skipped as non-finite."""
        if self.steps_in_backward:
            if self.before_step:
                self.before_step()
            self.optimizer.step()                           # Horovod: combines the Adasum deltas from backward
            return True
        if self.by_bucket and not bucket_step.has_step_hooks(self.optimizer):
            # Horovod: each bucket is stepped once it is back, the others still on the wire.
            finite = bucket_step.step_by_bucket(self.optimizer, self.first_bucket, self._loss_finite)
            return not self.check_loss or count_nonfinite(p, finite, "loss", self.limit)
        loss_flag = None
        if self.check_loss and self.flag_slot is None:
            # Horovod: non-finite loss on any rank -> skip on all; rides in the gradients' last allreduce.
            views = getattr(self.optimizer, "gradient_views", None)
            loss_flag = collectives.nonfinite_flag_async(step_loss(parts), "step_loss", self.predivide,
                                                         slot=views.flag if views else None,
                                                         op=getattr(self.optimizer, "loss_flag_op", None))
        gradients.synchronize_gradients(self.optimizer)     # Horovod: averaged gradients, equal on all ranks
        if self.scaler:
            self.scaler.unscale_(self.optimizer)            # Horovod: after the allreduce, so all ranks agree
            applied = gradients_finite(self.model, self.scaler, p, self.limit)
        else:
            finite = self._loss_finite() if loss_flag is None else collectives.all_finite(loss_flag)
            applied = not self.check_loss or count_nonfinite(p, finite, "loss", self.limit)
        if applied and self.before_step:
            self.before_step()
        if applied and self.max_norm:
            self._clip()                                    # after the average and the unscale, never before
        if applied:
            with self.optimizer.skip_synchronize():
                if self.scaler:
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
        if self.scaler:
            self.scaler.update()                            # halve the loss scale after an overflow
        return applied

    def _clip(self) -> None:
        # Horovod: every rank holds the same averaged gradients now, so this local norm IS the global norm (no
        # collective). Clipping each rank's own gradients before the average would give other weights.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm).detach()
        self.last_norm = norm
        if self.norms is not None:
            self.norms.append(norm)

    def _loss_finite(self) -> bool:
        # Read once the first bucket is back: the sum of every rank's flag (NaN if any rank's loss was not).
        return self.flag_slot is None or math.isfinite(float(self.flag_slot))


def step_loss(parts: list[BatchParts]) -> torch.Tensor:
    """The step's loss over its micro-batches (one value; NaN or inf if any of them was)."""
    return parts[0][0] if len(parts) == 1 else torch.stack([part[0] for part in parts]).double().sum()
