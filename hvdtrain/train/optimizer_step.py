"""One optimizer step, the same on every rank: gradients synchronised, checked for non-finite values,
unscaled (fp16), applied or skipped on every rank alike."""
from __future__ import annotations

from typing import Any

import torch

from hvdtrain.distributed import collectives, gradients
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

    def apply(self, p: Progress, parts: list[BatchParts]) -> bool:
        """Apply the step's gradients, the same on every rank; False when skipped as non-finite."""
        if self.steps_in_backward:
            self.optimizer.step()                           # Horovod: combines the Adasum deltas from backward
            return True
        loss_flag = None
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
