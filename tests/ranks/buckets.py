"""Rank-side: gradients in buckets (wrap_optimizer's bucket_mb) against one allreduce per gradient; rank 0 saves.

    python tests/ranks/buckets.py OUT.pt

Per setting (bucket_mb, compression, accumulate): 4 optimizer steps of one seeded model on each rank's own
data, then the weights, how many allreduces Horovod was handed (submissions: a bucket is one) and the tensors
and bytes they carried (tests/support/allreduce_count.py wraps the functions Horovod's optimizer calls).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/: the instrumentation

from support.allreduce_count import count_gradient_allreduces  # noqa: E402

from hvdtrain.distributed import collectives, gradients, runtime  # noqa: E402

STEPS = 4
# 0: per tensor; 25: DDP's default, one bucket here (the first is capped at 1 MB); 0.1: three buckets, the
# 256 KB weight alone (larger than the cap), as gradients.buckets cuts them
SETTINGS = [(0.0, "none", 1), (25.0, "none", 1), (0.1, "none", 1), (0.0, "none", 2), (0.1, "none", 2),
            (0.0, "fp16", 2), (0.1, "fp16", 2)]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def train(bucket_mb: float, compression: str, accumulate: int) -> dict:
    net = model()
    optimizer = gradients.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), net,
                                         accumulate=accumulate, compression=compression, bucket_mb=bucket_mb)
    collectives.broadcast_state(net, optimizer)
    generator = torch.Generator().manual_seed(world.rank)
    with count_gradient_allreduces() as count:
        for _ in range(STEPS):
            for _ in range(accumulate):
                inputs = torch.randn(16, 64, generator=generator)
                targets = torch.randint(0, 10, (16,), generator=generator)
                (nn.functional.cross_entropy(net(inputs), targets) / accumulate).backward()
            gradients.synchronize_gradients(optimizer)
            with optimizer.skip_synchronize():
                optimizer.step()
            optimizer.zero_grad()
    return {"weights": net.state_dict(), "submissions": count.submissions, "tensors": count.calls,
            "bytes": count.bytes, "digest": float(sum(p.double().sum() for p in net.parameters()))}


world = runtime.init()
torch.set_num_threads(1)
found = {setting: train(*setting) for setting in SETTINGS}
digests = collectives.allgather_object({setting: run["digest"] for setting, run in found.items()}, "digests")
if world.is_root:
    expected = {mb: len(gradients.buckets(model().parameters(), mb)) if mb else 6 for mb, _, _ in SETTINGS}
    torch.save({"found": found, "steps": STEPS, "buckets": expected, "digests": digests,
                "backend": runtime.backend_name()}, sys.argv[1])
runtime.shutdown()
