"""Issue 32 item 1: more workers than GPUs on a host is a one-line error before any collective, never an
NCCL abort ("Duplicate GPU detected"). The placement is a pure function of local rank/size, stages and
the visible GPU count, so it is tested here without a GPU."""
from __future__ import annotations

import socket

import pytest
import torch

from hvdtrain.errors import UserError
from hvdtrain.models.pipeline import assign_devices
from hvdtrain.train import device


@pytest.mark.parametrize("local_rank, local_size, stages, visible, expected", [
    (0, 1, 1, 1, [0]), (1, 2, 1, 2, [1]), (3, 4, 1, 8, [3]),          # one GPU each, by local rank
    (0, 2, 2, 4, [0, 1]), (1, 2, 2, 4, [2, 3]), (1, 2, 3, 8, [3, 4, 5]),  # hybrid: K consecutive GPUs
])
def test_every_worker_gets_its_own_gpus(local_rank, local_size, stages, visible, expected):
    assert assign_devices(local_rank, local_size, stages, visible) == expected


def test_no_two_workers_on_a_host_share_a_gpu():
    for local_size, stages in [(1, 1), (2, 1), (4, 2), (3, 3)]:
        owned = [g for r in range(local_size) for g in assign_devices(r, local_size, stages, local_size * stages)]
        assert sorted(owned) == list(range(local_size * stages))


@pytest.mark.parametrize("local_size, stages, visible, message", [
    (2, 1, 1, "2 workers on this host but 1 GPU visible: use at most 1 worker per host (horovodrun -np 1 ...) "
              "or --device cpu"),
    (4, 1, 2, "4 workers on this host but 2 GPUs visible: use at most 2 workers per host (horovodrun -np 2 ...) "
              "or --device cpu"),
    (2, 2, 3, "2 workers on this host x 2 stages need 4 GPUs but 3 GPUs visible: use --stages 1 or at most 1 "
              "worker per host (horovodrun -np 1 ...) or --device cpu"),
    (1, 3, 2, "1 worker on this host x 3 stages need 3 GPUs but 2 GPUs visible: use --stages 2 or --device cpu"),
])
def test_too_few_gpus_is_one_line_naming_the_fixes(local_size, stages, visible, message):
    for rank in range(local_size):  # every rank on the host stops with the same line: none waits alone
        with pytest.raises(UserError) as caught:
            assign_devices(rank, local_size, stages, visible)
        assert str(caught.value) == message and "\n" not in str(caught.value)


class FakeCuda:
    """torch.cuda of a host with `count` GPUs, recording what the worker pins."""

    def __init__(self, count: int) -> None:
        self.count, self.pinned = count, []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "set_device", self.pinned.append)


HOST = socket.gethostname()


def test_pick_device_on_a_one_gpu_host_with_two_ranks_refuses_before_pinning(monkeypatch):
    cuda = FakeCuda(1)
    cuda.install(monkeypatch)
    for choice in ("auto", "cuda"):
        with pytest.raises(UserError, match=r"^2 workers on this host but 1 GPU visible: .* or --device cpu$"):
            device.pick_device(choice, 1, local_size=2, views=[(HOST, ["GPU-a"]), (HOST, ["GPU-a"])])
    assert cuda.pinned == []  # nothing touched the GPU: the error comes before Horovod's first collective


def test_pick_device_pins_the_first_stage_gpu(monkeypatch):
    cuda = FakeCuda(4)
    cuda.install(monkeypatch)
    views = [(HOST, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"])] * 2
    assert device.pick_device("auto", 1, local_size=2, stages=2, views=views) == torch.device("cuda", 2)
    assert cuda.pinned == [2]


def test_one_process_per_gpu_takes_its_own_gpu(monkeypatch):
    """Slurm --gpus-per-task=1 (or a container per GPU): 4 ranks on a host, each seeing one different GPU."""
    cuda = FakeCuda(1)
    cuda.install(monkeypatch)
    views = [(HOST, [f"GPU-{r}"]) for r in range(4)] + [("other-host", ["GPU-0"])]
    assert device.pick_device("cuda", 3, local_size=4, views=views) == torch.device("cuda", 0)
    assert cuda.pinned == [0]
    with pytest.raises(UserError, match=r"^--stages 2 needs 2 GPUs per worker but this worker sees 1; "):
        device.pick_device("cuda", 3, local_size=4, stages=2, views=views)


def test_a_shared_view_is_not_mistaken_for_an_own_one():
    assert not device.own_gpu_view([(HOST, ["GPU-a"]), (HOST, ["GPU-a"])], HOST)   # two ranks, one GPU: refused later
    assert not device.own_gpu_view([(HOST, ["GPU-a"])], HOST)                       # alone on its host
    assert not device.own_gpu_view([(HOST, []), (HOST, [])], HOST)
    assert device.own_gpu_view([(HOST, ["GPU-a", "GPU-b"]), (HOST, ["GPU-c", "GPU-d"])], HOST)
    assert device.assign_devices(1, 2, 2, visible=2, own_view=True) == [0, 1]


def test_device_cpu_never_asks_cuda(monkeypatch):
    def boom(*_: object) -> None:
        raise AssertionError("--device cpu asked CUDA")

    for name in ("is_available", "device_count", "set_device", "init"):
        monkeypatch.setattr(torch.cuda, name, boom)
    assert device.pick_device("cpu", 3, local_size=4, stages=2) == torch.device("cpu")


def test_a_launchers_first_gpu_wins_over_the_local_rank_share(monkeypatch):
    """hvdtrain.ray with gpus_per_worker=2, --stages 1: rank 1's own GPUs start at index 2, not 1."""
    cuda = FakeCuda(4)
    cuda.install(monkeypatch)
    monkeypatch.setenv("HVDTRAIN_FIRST_GPU", "2")
    views = [(HOST, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"])] * 2
    assert device.pick_device("cuda", 1, local_size=2, views=views) == torch.device("cuda", 2)
    with pytest.raises(UserError, match=r"^HVDTRAIN_FIRST_GPU=2 with --stages 3 needs 5 visible GPUs but 4"):
        device.pick_device("cuda", 1, local_size=2, stages=3, views=views)
