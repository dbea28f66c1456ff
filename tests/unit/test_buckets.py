"""gradients.buckets: DDP's bucketing of parameters (reverse order, a 1 MB first bucket, then the cap), and the
bucket_mb option's check."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hvdtrain.config.train_config import ConfigError, TrainConfig
from hvdtrain.distributed.gradients import buckets


def shapes(groups: list[list[nn.Parameter]]) -> list[list[tuple[int, ...]]]:
    return [[tuple(p.shape) for p in group] for group in groups]


def test_parameters_go_in_reverse_order_into_buckets_up_to_the_cap_the_first_up_to_1_mb():
    # 256 KB weights: four fill the 1 MB first bucket (with the last bias), then 2 MB buckets hold eight
    net = nn.Sequential(*(nn.Linear(256, 256, bias=False) for _ in range(12)), nn.Linear(256, 1))
    groups = buckets(net.parameters(), 2.0)
    assert shapes(groups) == [[(1,), (1, 256), (256, 256), (256, 256), (256, 256)],
                              [(256, 256)] * 8, [(256, 256)] * 1]
    assert [p for group in groups for p in group] == list(net.parameters())[::-1]


def test_a_parameter_larger_than_the_cap_is_a_bucket_of_its_own_and_frozen_ones_are_left_out():
    net = nn.Sequential(nn.Linear(8, 8), nn.Linear(1024, 1024), nn.Linear(8, 8))
    net[0].weight.requires_grad_(False)
    assert shapes(buckets(net.parameters(), 0.5)) == [[(8,), (8, 8), (1024,)], [(1024, 1024)], [(8,)]]


def test_a_cap_below_1_mb_caps_the_first_bucket_too():
    net = nn.Sequential(nn.Linear(128, 128, bias=False), nn.Linear(128, 128, bias=False))   # 64 KB each
    assert shapes(buckets(net.parameters(), 0.1)) == [[(128, 128)], [(128, 128)]]
    assert shapes(buckets(net.parameters(), 25)) == [[(128, 128), (128, 128)]]


def test_bf16_parameters_count_their_own_bytes():
    net = nn.Sequential(nn.Linear(512, 512, bias=False), nn.Linear(512, 512, bias=False)).to(torch.bfloat16)
    assert shapes(buckets(net.parameters(), 1.0)) == [[(512, 512), (512, 512)]]   # 2 x 512 KB


def test_a_bucket_holds_one_dtype():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.bfloat16), nn.Linear(4, 4))
    assert [[p.dtype for p in group] for group in buckets(net.parameters(), 25)] == [
        [torch.float32] * 2, [torch.bfloat16] * 2, [torch.float32] * 2]


def test_a_negative_bucket_size_is_refused_naming_the_value():
    with pytest.raises(ConfigError, match=r"bucket_mb must be >= 0 .* got -1"):
        TrainConfig(bucket_mb=-1)


def test_gradient_views_lie_back_to_back_per_bucket_and_backward_adds_into_them():
    from hvdtrain.distributed.gradients import GradientViews

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    groups = buckets(net.parameters(), 0.01)   # 10 KB cap: the 16 KB weight alone, then the rest
    views = GradientViews(groups)
    views.attach()
    ends = []
    for flat, group in zip(views.flats, groups, strict=True):
        start = flat.data_ptr()
        for param in group:   # each gradient the next slice of its bucket's buffer, in the bucket's order
            assert param.grad.data_ptr() == start and param.grad.shape == param.shape
            start += param.numel() * param.element_size()
        ends.append(start)
    # the first bucket (sent first) keeps one float32 element after its gradients for the step's non-finite-loss flag
    assert views.flag is not None and views.flag.data_ptr() == ends[0]
    assert [flat.numel() for flat in views.flats] == [10 + 10 * 64 + 64 + 1, 64 * 64]
    plain = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    plain.load_state_dict(net.state_dict())
    batch = torch.randn(8, 64)
    for model in (net, plain):
        model(batch).square().mean().backward()
    for (name, a), b in zip(net.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=0, rtol=0, msg=name)
    # backward added into the slices: the buffers hold the gradients
    filled = [flat[:sum(p.numel() for p in group)] for flat, group in zip(views.flats, groups, strict=True)]
    assert torch.equal(torch.cat(filled), torch.cat([p.grad.flatten() for group in groups for p in group]))
    for param in net.parameters():     # what zero_grad does; attach() makes them views again, zeroed
        param.grad = None
    views.attach()
    assert groups[-1][-1].grad.data_ptr() == views.flats[-1].data_ptr() + views.flats[-1].element_size() * sum(
        p.numel() for p in groups[-1][:-1])
    assert all(flat.abs().sum() == 0 for flat in views.flats) and len(groups) == 2


def test_a_bfloat16_first_bucket_has_no_flag_element():
    from hvdtrain.distributed.gradients import GradientViews

    net = nn.Linear(4, 4).to(torch.bfloat16)
    views = GradientViews(buckets(net.parameters(), 25.0))
    assert views.flag is None and views.flats[0].numel() == 20


def test_the_optimizer_adapter_refuses_another_horovod_in_one_line_naming_both_versions(monkeypatch):
    """Horovod's DistributedOptimizer internals that buckets use were read from one version (issue 55): under
    another, the first touch of them is refused, not a wrong gradient."""
    import threading

    from hvdtrain.distributed import horovod_optimizer, horovod_runner
    from hvdtrain.errors import UserError

    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    monkeypatch.setattr(horovod_optimizer, "_checked", threading.Event())
    monkeypatch.setattr(horovod_runner, "WRITTEN_FOR", "0.27.0")
    with pytest.raises(UserError) as refused:
        horovod_optimizer.bucket_groups(optimizer)
    message = str(refused.value)
    assert "\n" not in message and f"Horovod {horovod_runner.version()} is installed" in message
    assert "Horovod 0.27.0's" in message
    monkeypatch.setattr(horovod_runner, "WRITTEN_FOR", horovod_runner.version())
    assert horovod_optimizer.bucket_groups(optimizer) == [] and horovod_optimizer.in_flight(optimizer) == {}
