"""Tier 1: model parallel stages and micro-batching, on CPU (the same code path as on GPUs)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hvdtrain.config.train_config import load_config
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.models.pipeline import Pipeline, assign_devices, balanced_split, place, stage_devices

CPU = torch.device("cpu")


def test_balanced_split_is_contiguous_non_empty_and_even():
    assert balanced_split([0, 100, 0, 100, 0, 10], 2) == [3, 3]
    assert balanced_split([10, 10, 10, 10], 4) == [1, 1, 1, 1]
    assert balanced_split([1000, 0, 0, 1], 3) == [2, 1, 1]   # a layer left for each later stage
    with pytest.raises(UserError, match="cannot split a model of 2 layers into 3 stages"):
        balanced_split([1, 1], 3)


def test_stage_devices_hybrid_placement_and_validation():
    assert stage_devices(torch.device("cuda", 2), 2, visible_gpus=4) == [torch.device("cuda", 2),
                                                                           torch.device("cuda", 3)]
    assert stage_devices(CPU, 3, visible_gpus=0) == [CPU] * 3
    # The refusal of too few GPUs for the host's workers x stages comes first, where the first GPU is picked.
    with pytest.raises(UserError, match=r"2 workers on this host x 2 stages need 4 GPUs but 3 GPUs visible"):
        assign_devices(0, 2, 2, visible=3)
    with pytest.raises(UserError, match=r"^--stages 2 from GPU 2 needs GPUs up to 3 but 3 are visible"):
        stage_devices(torch.device("cuda", 2), 2, visible_gpus=3)


@pytest.mark.parametrize("model_name, k, m", [("mlp", 2, 4), ("cnn", 2, 4), ("cnn", 3, 3)])
def test_pipeline_gradients_equal_the_unsplit_model_for_several_steps(model_name, k, m):
    config = load_config(model=model_name, hidden=32)
    torch.manual_seed(0)
    plain = build_model(config, (1, 8, 8), 10)
    pipe = Pipeline(copy.deepcopy(plain), [CPU] * k, micro_batches=m)
    assert len(pipe.stage_names) == k and all(pipe.stage_names)
    # Parameter names are the unsplit model's, so weights move freely between the two.
    assert pipe.state_dict().keys() == plain.state_dict().keys()
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_pipe = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        inputs, targets = torch.randn(32, 1, 8, 8, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        for model, opt in ((plain, opt_plain), (pipe, opt_pipe)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
        grads = dict(pipe.named_parameters())
        for name, param in plain.named_parameters():
            assert param.grad is not None and grads[name].grad is not None
            torch.testing.assert_close(grads[name].grad, param.grad, atol=1e-6, rtol=0)
        opt_plain.step()
        opt_pipe.step()
    for name, param in plain.named_parameters():
        torch.testing.assert_close(dict(pipe.named_parameters())[name], param, atol=1e-6, rtol=0)


def test_uneven_last_micro_batch_and_explicit_split():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    pipe = Pipeline(copy.deepcopy(model), [CPU] * 2, split=(1, 4), micro_batches=4)
    assert pipe.stage_names == [["0"], ["1", "2", "3", "4"]]
    inputs = torch.randn(7, 4)     # chunks of 2, 2, 2, 1
    torch.testing.assert_close(pipe(inputs), model(inputs), atol=1e-6, rtol=0)


def test_a_list_of_stages_and_errors():
    stages = nn.ModuleList([nn.Sequential(nn.Linear(4, 8), nn.ReLU()), nn.Linear(8, 2)])
    pipe = place(stages, CPU, stages=1, micro_batches=2)
    assert isinstance(pipe, Pipeline) and pipe.stage_names == [["0"], ["1"]]
    assert pipe(torch.randn(5, 4)).shape == (5, 2)
    with pytest.raises(UserError, match="needs an nn.Sequential model"):
        Pipeline(nn.Linear(2, 2), [CPU] * 2)
    with pytest.raises(UserError, match=r"stage split \(1, 1\) does not cut 3 layers"):
        Pipeline(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), [CPU] * 2, split=(1, 1))


def test_trainer_runs_a_pipeline_in_one_real_worker(one_worker):
    from hvdtrain.data.datasets import build_data
    from hvdtrain.train.trainer import Trainer

    config = load_config(model="mlp", hidden=32, stages=3, micro_batches=2, max_steps=5, run_dir="", threads=1)
    data = build_data(config)
    trainer = Trainer(build_model(config, (1, 8, 8), 10), data.train, data.val, config=config)
    assert isinstance(trainer.model, Pipeline) and len(trainer.model.stage_names) == 3
    summary = trainer.fit().summary
    assert summary["steps"] == 5 and summary["val_samples"] == 359
