"""Rank-side: Horovod's gradient hooks under a torch.compile'd model, then a --compile run; rank 0 reports.

    python tests/ranks/compiled.py OUT.json --key value ...   (the rest: TrainConfig overrides)

The hooks check: DistributedOptimizer registers a hook on each parameter's gradient accumulator and starts
that parameter's allreduce from it, inside backward. Were the hooks not to fire under compile, synchronize()
would still allreduce every gradient (correct weights, no overlap): so the check looks at the ops in flight
right after backward, before step().
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hvdtrain.config.train_config import load_config
from hvdtrain.distributed import collectives, gradients, runtime
from hvdtrain.train.trainer import fit

out, overrides = Path(sys.argv[1]), sys.argv[2:]
world = runtime.init()
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
    torch.nn.functional.cross_entropy(compiled(inputs), targets).backward()
    in_flight_after_backward.append(sum(isinstance(handle, int) for handle, _ in optimizer._handles.values()))
    optimizer.step()
history = fit(load_config(overrides=overrides))
if world.is_root:
    out.write_text(json.dumps({"in_flight_after_backward": in_flight_after_backward,
                               "params": len(list(net.parameters())),
                               "digests": history.summary["param_digests"], "steps": history.summary["steps"]}))
