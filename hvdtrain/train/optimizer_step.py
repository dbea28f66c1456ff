"""One optimizer step, the same on every rank: gradients synchronised, checked for non-finite values,
unscaled (fp16), applied or skipped on every rank alike."""
from __future__ import annotations

import math
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
    """

    def __init__(self, optimizer: Any, model: torch.nn.Module, precision: Precision, *, op: str,
                 nonfinite_limit: int, predivide: float) -> None:
        self.optimizer, self.model, self.scaler = optimizer, model, precision.scaler
        self.limit, self.predivide = nonfinite_limit, predivide
        self.steps_in_backward = gradients.steps_in_backward(op)
        # The loss decides, not a pass over every gradient (that pass cost ~5% of an MLP step; see
        # benchmarks/README.md). fp16 keeps the gradient check: an overflow there leaves the loss finite.
        self.check_loss = bool(nonfinite_limit) and not self.steps_in_backward and self.scaler is None
        # Where the loss flag rides in the first bucket (gradients.scale_before_sending), written before backward.
        self.flag_slot = getattr(optimizer, "loss_flag_slot", None) if self.check_loss else None
        self.first_bucket = getattr(optimizer, "loss_flag_bucket", None)

    def before_backward(self, parts: list[BatchParts]) -> None:
        """The step's loss is known: write its non-finite flag where the first bucket will send it."""
        if self.flag_slot is not None:
            loss = parts[0][0] if len(parts) == 1 else torch.stack([part[0] for part in parts]).double().sum()
            self.flag_slot.copy_((loss.detach() * 0).reshape(self.flag_slot.shape))   # inf * 0 is NaN

    def apply(self, p: Progress, parts: list[BatchParts]) -> bool:
        """Apply the step's gradients, the same on every rank; False when skipped as non-finite."""
        if self.steps_in_backward:
            self.optimizer.step()                           # Horovod: combines the Adasum deltas from backward
            return True
        if self.scaler is None and (self.flag_slot is not None or not self.check_loss) and (
                bucket_step.can_step_by_bucket(self.optimizer)):
            # Horovod: each bucket is stepped once it is back, the others still on the wire.
            finite = bucket_step.step_by_bucket(self.optimizer, self.first_bucket, self._loss_finite)
            return not self.check_loss or count_nonfinite(p, finite, "loss", self.limit)
        loss_flag = None
        if self.flag_slot is not None:
            gradients.synchronize_gradients(self.optimizer)
            applied = count_nonfinite(p, self._loss_finite(), "loss", self.limit)
            if applied:
                with self.optimizer.skip_synchronize():
                    self.optimizer.step()
            return applied
        if self.check_loss:
            # Horovod: non-finite loss on any rank -> skip on all; rides in the gradients' last allreduce.
            loss = parts[0][0] if len(parts) == 1 else torch.stack([part[0] for part in parts]).double().sum()
            views = getattr(self.optimizer, "gradient_views", None)
            loss_flag = collectives.nonfinite_flag_async(loss, "step_loss", self.predivide,
                                                         slot=views.flag if views else None,
                                                         op=getattr(self.optimizer, "loss_flag_op", None))
        gradients.synchronize_gradients(self.optimizer)     # Horovod: averaged gradients, equal on all ranks
        if self.scaler:
            self.scaler.unscale_(self.optimizer)            # Horovod: after the allreduce, so all ranks agree
            applied = gradients_finite(self.model, self.scaler, p, self.limit)
        else:
            applied = loss_flag is None or count_nonfinite(p, collectives.all_finite(loss_flag), "loss", self.limit)
        if applied:
            with self.optimizer.skip_synchronize():
                if self.scaler:
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
        if self.scaler:
            self.scaler.update()                            # halve the loss scale after an overflow
        return applied

    def _loss_finite(self) -> bool:
        # Read once the first bucket is back: the sum of every rank's flag (NaN if any rank's loss was not).
        return self.flag_slot is None or math.isfinite(float(self.flag_slot))
