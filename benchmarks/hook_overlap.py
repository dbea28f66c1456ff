"""Do Horovod's gradient allreduces start during backward? Eager vs torch.compile, under horovodrun.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.hook_overlap --model cnn [--compile]

Wraps the DistributedOptimizer's per-gradient start (`_allreduce_grad_async`, called from the gradient
accumulator hooks) to stamp each start, and stamps the return of `loss.backward()`; prints, per step, how many
allreduces started before backward returned, of how many, and when the first one started (the fraction of
backward elapsed): with overlap the first starts early; hooks deferred to the end of a compiled backward
start late, all together.
"""
from __future__ import annotations

import argparse
import statistics
import time

import horovod.torch as hvd
import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.models.builtin import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(TrainConfig(model=args.model), (1, 28, 28), 10)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    starts: list[float] = []
    original = optimizer._allreduce_grad_async

    def stamped(p):  # the hook's call into Horovod: one per gradient per step
        starts.append(time.perf_counter())
        return original(p)

    optimizer._allreduce_grad_async = stamped
    run = torch.compile(model) if args.compile else model
    inputs, targets = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    counts = []
    for step in range(args.steps):
        starts.clear()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(run(inputs), targets)
        begun = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        optimizer.step()
        inside = sum(begun <= t < ended for t in starts)
        if step >= 2:  # after the compile and the first negotiation
            first = (min(starts) - begun) / (ended - begun) if starts else float("nan")
            counts.append((inside, len(starts), ended - begun, first))
    if hvd.rank() == 0:
        print(f"OVERLAP model={args.model} compile={args.compile} started inside backward: "
              f"{[c[0] for c in counts]} of {[c[1] for c in counts]}; "
              f"backward median {1000 * statistics.median(c[2] for c in counts):.1f} ms; first start at "
              f"{[round(c[3], 2) for c in counts]} of backward", flush=True)


if __name__ == "__main__":
    main()
