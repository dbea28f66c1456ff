"""Rank-side: the optimizer stepping bucket by bucket (distributed/bucket_step.py) against one step after the last
bucket; rank 0 saves.

    python tests/ranks/bucket_step.py OUT.pt

Per optimizer (SGD with momentum, AdamW) and way (HVDTRAIN_STEP_BY_BUCKET=1 or 0): 5 steps of one seeded model,
in three buckets, through the Trainer's OptimizerStep on each rank's own data; at step 3 rank 1's loss is NaN, and
every rank must skip that step. Saves the weights after each step, how many times the optimizer's own step() ran
and the steps skipped.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

from hvdtrain.distributed import collectives, gradients, horovod_optimizer, runtime
from hvdtrain.train.optimizer_step import OptimizerStep
from hvdtrain.train.precision import Precision, PrecisionSettings
from hvdtrain.train.progress import Progress

STEPS, NAN_STEP = 5, 3
OPTIMIZERS = {"sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3),
              "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
              # the last layer's bias, the first bucket's first parameter, left out of the optimizer (but trainable)
              "partial": lambda params: torch.optim.SGD(list(params)[:-1], lr=0.1, momentum=0.9)}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def train(kind: str, by_bucket: bool) -> dict:
    os.environ["HVDTRAIN_STEP_BY_BUCKET"] = "1" if by_bucket else "0"
    net = model()
    optimizer = gradients.wrap_optimizer(OPTIMIZERS[kind](net.parameters()), net, bucket_mb=0.1)
    collectives.broadcast_state(net, optimizer)
    step = OptimizerStep(optimizer, net, Precision(PrecisionSettings("fp32"), torch.device("cpu")), op="average",
                         nonfinite_limit=3, predivide=1.0)
    base = type(optimizer).__mro__[1]
    calls = []
    plain_step = base.step

    def counted(self, *args, **kwargs):   # the user's optimizer's own step(), under Horovod's wrapper
        calls.append(1)
        return plain_step(self, *args, **kwargs)

    base.step = counted
    generator = torch.Generator().manual_seed(world.rank)
    p, weights = Progress(), []
    try:
        for n in range(STEPS):
            optimizer.zero_grad()
            inputs = torch.randn(16, 64, generator=generator)
            targets = torch.randint(0, 10, (16,), generator=generator)
            loss = nn.functional.cross_entropy(net(inputs), targets)
            if n == NAN_STEP and world.rank == 1:
                loss = loss * float("nan")
            parts = [(loss.detach(), 16, [], [])]
            step.before_backward(parts)
            loss.backward()
            step.apply(p, parts)
            weights.append({k: v.clone() for k, v in net.state_dict().items()})
    finally:
        base.step = plain_step
    return {"weights": weights, "calls": len(calls), "skipped": p.skipped,
            "buckets": len(horovod_optimizer.bucket_groups(optimizer))}


world = runtime.init()
torch.set_num_threads(1)
found = {(kind, by_bucket): train(kind, by_bucket) for kind in OPTIMIZERS for by_bucket in (True, False)}
digests = collectives.allgather_object(
    {key: float(sum(w.double().sum() for w in run["weights"][-1].values())) for key, run in found.items()}, "digests")
if world.is_root:
    torch.save({"found": found, "digests": digests, "steps": STEPS, "nan_step": NAN_STEP}, sys.argv[1])
runtime.shutdown()
