"""Rank-side: Horovod's gradient hooks under compiled models, then a --compile run; rank 0 reports.

    python tests/ranks/compiled.py OUT.json --key value ...   (the rest: TrainConfig overrides)

DistributedOptimizer registers a hook on each parameter's gradient accumulator and starts that parameter's
allreduce from it. Were the hooks not to fire at all under compile, synchronize() would still allreduce every
gradient (correct weights, no overlap): the first check counts the allreduces started inside backward. Under
one whole-model graph they do fire, but all when its backward ends (no overlap): the second check stamps each
allreduce's start and reports when the first began, as a fraction of backward, for hvdtrain's block-by-block
compile (compile_model) and for torch.compile(model), the same stamping as benchmarks/hook_overlap.py.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from horovod.torch import optimizer as hvd_optimizer
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/: the instrumentation

from support.allreduce_count import count_gradient_allreduces  # noqa: E402

from hvdtrain.config.train_config import load_config
from hvdtrain.distributed import collectives, gradients, runtime
from hvdtrain.models.compiled import compile_model
from hvdtrain.train.config_fit import fit

out, overrides = Path(sys.argv[1]), sys.argv[2:]
world = runtime.init()
torch.set_num_threads(1)


def deep() -> nn.Module:
    torch.manual_seed(0)
    hidden = (m for _ in range(3) for m in (nn.Linear(512, 512), nn.ReLU()))
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), *hidden, nn.Linear(512, 10))


def first_start(compile_whole: bool) -> float:
    """Median over 5 steps (after 3 warm-up ones) of when the first allreduce started, as a fraction of backward."""
    net = deep()
    run = torch.compile(net) if compile_whole else compile_model(net)
    optimizer = gradients.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.01), net)
    starts: list[float] = []
    submit = hvd_optimizer.allreduce_async_   # what the hooks call, once per gradient (no buckets here)
    hvd_optimizer.allreduce_async_ = lambda *args, **kw: (starts.append(time.perf_counter()), submit(*args, **kw))[1]
    inputs, targets = torch.randn(128, 256), torch.randint(0, 10, (128,))
    fractions = []
    for step in range(8):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(run(inputs), targets)
        starts.clear()
        begun = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        optimizer.step()
        if step >= 3:
            fractions.append((min(starts) - begun) / (ended - begun))
    hvd_optimizer.allreduce_async_ = submit
    return statistics.median(fractions)


torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
compiled = torch.compile(net)
optimizer = gradients.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1), compiled)
collectives.broadcast_state(compiled, optimizer)
generator = torch.Generator().manual_seed(world.rank)
in_flight_after_backward = []
for _ in range(3):
    optimizer.zero_grad()
    inputs, targets = torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    with count_gradient_allreduces() as count:
        torch.nn.functional.cross_entropy(compiled(inputs), targets).backward()
    in_flight_after_backward.append(count.calls)   # started by the hooks, before backward returned
    optimizer.step()
first = {"blocks": first_start(compile_whole=False), "whole": first_start(compile_whole=True)}
history = fit(load_config(overrides=overrides))
if world.is_root:
    out.write_text(json.dumps({"in_flight_after_backward": in_flight_after_backward,
                               "params": len(list(net.parameters())), "first_start": first,
                               "digests": history.summary["param_digests"], "steps": history.summary["steps"]}))
