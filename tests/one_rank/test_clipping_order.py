"""Tier 2, one real Horovod worker: OptimizerStep's clipping order with a loss scaler (fp16's path; a CPU
GradScaler here, as tests/one_rank/test_features.py does): allreduce, unscale, clip by the global norm, step,
so the weights equal a plain unscaled clip-and-step; a step skipped for overflowing gradients is not clipped
and logs no norm. The multi-worker equivalence is tests/multirank/test_clipping_multirank.py."""
from __future__ import annotations

import torch
from torch import nn

from hvdtrain.distributed import gradients
from hvdtrain.train.optimizer_step import OptimizerStep
from hvdtrain.train.precision import Precision, PrecisionSettings
from hvdtrain.train.progress import Progress

MAX_NORM = 0.05


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(32, 8, generator=generator), torch.randint(0, 4, (32,), generator=generator)


def test_a_scaled_step_is_unscaled_then_clipped_and_an_overflow_step_is_not_clipped(one_worker):
    inputs, targets = batch()
    # The reference: no scaler, no Horovod: clip the gradients by their norm, then step.
    plain = model()
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.5)
    nn.functional.cross_entropy(plain(inputs), targets).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), MAX_NORM)
    optimizer.step()
    assert expected_norm > 4 * MAX_NORM   # the step is clipped

    net = model()
    wrapped = gradients.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.5), net, bucket_mb=0.0)
    precision = Precision(PrecisionSettings("fp32"), torch.device("cpu"))
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)   # fp16's scaler, on CPU
    norms: list[torch.Tensor] = []
    step = OptimizerStep(wrapped, net, precision, op="average", nonfinite_limit=3, predivide=1.0,
                         max_norm=MAX_NORM, norms=norms)
    assert not step.by_bucket
    p = Progress()
    loss = nn.functional.cross_entropy(net(inputs), targets)
    precision.scaler.scale(loss).backward()
    assert step.apply(p, [(loss.detach(), 32, [], [])])
    assert len(norms) == 1 and step.last_norm is norms[0]
    torch.testing.assert_close(norms[0], expected_norm, atol=1e-6, rtol=1e-5)   # the unscaled norm, before clipping
    for got, want in zip(net.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    # An overflow: gradients not finite after unscaling; skipped on every rank, not clipped, no norm logged.
    before = [param.detach().clone() for param in net.parameters()]
    wrapped.zero_grad()
    loss = nn.functional.cross_entropy(net(inputs), targets) * float("inf")
    precision.scaler.scale(loss).backward()
    assert not step.apply(p, [(loss.detach(), 32, [], [])])
    assert len(norms) == 1 and p.skipped == 1
    assert precision.scaler.get_scale() == 2.0 ** 9
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), before, strict=True))

