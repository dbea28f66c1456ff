"""Do Horovod's gradient allreduces start during backward? Eager vs torch.compile, under horovodrun.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.hook_overlap --model cnn [--compile MODE]

MODE: `whole` (torch.compile(model), one graph) or `regional` (hvdtrain's --compile: each block compiled
apart, hvdtrain/models/compiled.py); without --compile the model runs eagerly.

Wraps `allreduce_async_` as Horovod's optimizer module calls it (once per gradient, from the gradient
accumulator hooks) to stamp each start, and stamps the return of `loss.backward()`; prints, per step, how
many allreduces started before backward returned, of how many, how many in its first half, and when the
first one started (the fraction of backward elapsed): with overlap the first starts early; hooks deferred to
the end of a compiled backward start late, all together. Also stamps each parameter's
`register_post_accumulate_grad_hook` (the hook PyTorch calls compile-friendly) to see whether it fires any
earlier than the accumulator hooks under compile.
"""
from __future__ import annotations

import argparse
import statistics
import time

import horovod.torch as hvd
import torch
from horovod.torch import optimizer as hvd_optimizer
from torch import nn

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.models.builtin import build_model
from hvdtrain.models.compiled import compile_model
from hvdtrain.models.zoo import resnet18


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "resnet18"])
    parser.add_argument("--width", type=int, default=64, help="resnet18's first-stage channels (64: ResNet-18)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--compile", choices=["none", "whole", "regional"], default="none")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = (3, 32, 32) if args.model == "resnet18" else (1, 28, 28)
    model = (resnet18(3, 10, args.width) if args.model == "resnet18"
             else build_model(TrainConfig(model=args.model), shape, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    starts: list[float] = []
    submit = hvd_optimizer.allreduce_async_

    def stamped(*args, **kwargs):  # the hook's call into Horovod: one per gradient per step
        starts.append(time.perf_counter())
        return submit(*args, **kwargs)

    hvd_optimizer.allreduce_async_ = stamped
    accumulated: list[float] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _: accumulated.append(time.perf_counter()))
    run = (torch.compile(model) if args.compile == "whole"
           else compile_model(model) if args.compile == "regional" else model)
    inputs, targets = torch.randn(args.batch, *shape), torch.randint(0, 10, (args.batch,))
    counts = []
    for step in range(args.steps):
        starts.clear()
        accumulated.clear()
        stepped = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(run(inputs), targets)
        begun = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        optimizer.step()
        done = time.perf_counter()
        inside = sum(begun <= t < ended for t in starts)
        early = sum(begun <= t < (begun + ended) / 2 for t in starts)
        if step >= 2:  # after the compile and the first negotiation
            first = (min(starts) - begun) / (ended - begun) if starts else float("nan")
            post = (min(accumulated) - begun) / (ended - begun) if accumulated else float("nan")
            counts.append((inside, len(starts), ended - begun, first, post, done - stepped, early))
    if hvd.rank() == 0:
        print(f"OVERLAP model={args.model} compile={args.compile} started inside backward: "
              f"{[c[0] for c in counts]} of {[c[1] for c in counts]}; in its first half: {[c[6] for c in counts]}; "
              f"backward median {1000 * statistics.median(c[2] for c in counts):.1f} ms; "
              f"step median {1000 * statistics.median(c[5] for c in counts):.1f} ms; first start at "
              f"{[round(c[3], 2) for c in counts]} of backward; first post-accumulate hook at "
              f"{[round(c[4], 2) for c in counts]}", flush=True)


if __name__ == "__main__":
    main()
