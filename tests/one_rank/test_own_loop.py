"""Tier 2: a loop of the user's own through hvdtrain.prepare on one real Horovod worker: what it returns, a few steps,
and a save/load round trip that resumes mid-epoch at the saved position (hvdtrain/train/own_loop.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdtrain
from hvdtrain.errors import UserError


def data(n: int = 40) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=gen, dtype=torch.float64), torch.arange(n))


def keep_index(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A collate function of the user's own: must be the one the prepared loader calls."""
    inputs, index = zip(*batch, strict=True)
    return torch.stack(inputs), torch.stack(index)


def model_and_optimizer(lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = nn.Linear(4, 1).double()
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def train(model, optimizer, loader, epochs: range, seen: list[int], stop_after: int | None = None) -> bool:
    """A plain loop; False when stopped after `stop_after` steps of the last epoch."""
    for epoch in epochs:
        loader.set_epoch(epoch)
        for step, (inputs, index) in enumerate(loader):
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            seen.extend(index.tolist())
            if stop_after is not None and epoch == epochs[-1] and step + 1 == stop_after:
                return False
    return True


def test_prepare_keeps_the_loader_and_scales_the_lr_by_the_policy(one_worker, capsys):
    model, optimizer = model_and_optimizer()
    loader = DataLoader(data(), batch_size=8, shuffle=True, collate_fn=keep_index, drop_last=True)
    model, optimizer, prepared = hvdtrain.prepare(model, optimizer, loader, lr_scaling="linear")
    assert "lr 0.1 -> 0.1 (linear scaling over 1 worker;" in capsys.readouterr().out
    assert prepared.collate_fn is keep_index and prepared.batch_size == 8 and len(prepared) == 5
    assert hasattr(optimizer, "synchronize") and optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    prepared.set_epoch(0)
    first = [index.tolist() for _, index in prepared]
    prepared.set_epoch(1)
    second = [index.tolist() for _, index in prepared]
    assert sorted(sum(first, [])) == list(range(40)) and first != second    # every sample once, a new shuffle


def test_bad_settings_are_one_line_errors(one_worker):
    model, optimizer = model_and_optimizer()
    with pytest.raises(UserError, match="hvdtrain.prepare: .*lr_scaling") as err:
        hvdtrain.prepare(model, optimizer, lr_scaling="double")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="DataLoaders"):
        hvdtrain.prepare(model, optimizer, data())


def test_a_checkpoint_resumes_mid_epoch_where_the_uninterrupted_run_was(one_worker, tmp_path):
    def fresh():
        model, optimizer = model_and_optimizer()
        return hvdtrain.prepare(model, optimizer, DataLoader(data(), batch_size=8, shuffle=True,
                                                             collate_fn=keep_index), lr_scaling="none")

    model, optimizer, loader = fresh()
    whole: list[int] = []
    train(model, optimizer, loader, range(2), whole)
    expected = [p.detach().clone() for p in model.parameters()]

    model, optimizer, loader = fresh()
    first: list[int] = []
    assert not train(model, optimizer, loader, range(2), first, stop_after=2)    # stopped in epoch 1, step 2
    path = hvdtrain.save(tmp_path / "ckpt.pt", model, optimizer, loader, extra={"epoch": 1})
    assert path == tmp_path / "ckpt.pt" and loader.state_dict() == {"epoch": 1, "position": 16}

    model, optimizer, loader = fresh()
    extra = hvdtrain.load(path, model, optimizer, loader)
    rest: list[int] = []
    train(model, optimizer, loader, range(extra["epoch"], 2), rest)
    assert first + rest == whole      # the same samples in the same order: none skipped, none repeated
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-12)   # momentum restored too


def test_load_refuses_a_missing_file_in_one_line(one_worker, tmp_path):
    model, optimizer = model_and_optimizer()
    model, optimizer = hvdtrain.prepare(model, optimizer)
    with pytest.raises(UserError, match="does not exist"):
        hvdtrain.load(tmp_path / "none.pt", model, optimizer)
