"""`hvdtrain predict` runs the model on the rank's device and hands back CPU outputs in the data's order."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hvdtrain.cli import predict
from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.environment.process import Process
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.evaluation import interleave

JOB = dict(dataset="synthetic", synthetic_samples=60, val_fraction=0.5, synthetic_shape=(6,), model="mlp", hidden=8)
ONE_RANK = Process(0, 1, 0, 1, "none")


@pytest.fixture(scope="module")
def trained():
    config = load_config(**JOB)
    data = build_data(config)
    torch.manual_seed(7)
    model = build_model(config, (6,), data.num_classes).eval()
    inputs = torch.stack([data.val[i][0] for i in range(len(data.val))])
    with torch.no_grad():
        expected = model(inputs)
    return config, model.state_dict(), expected


def test_shards_on_the_given_device_rebuild_the_whole_output(trained):
    config, state, expected = trained
    shards = [predict.predict_split(state, config, "val", rank, 3, 4, torch.device("cpu")) for rank in range(3)]
    assert [len(s) for s in shards] == [10, 10, 10]
    torch.testing.assert_close(interleave(shards), expected, atol=1e-6, rtol=0)


def test_cpu_choice_never_asks_for_a_gpu_and_a_compressed_model_stays_on_cpu(trained):
    config, state, _ = trained
    assert predict.rank_device(state, "cpu", ONE_RANK) == torch.device("cpu")
    # An exported program is never moved: its int8 kernels exist on CPU only. (The file need not exist here.)
    assert predict.rank_device(Path("model.pt2"), "cuda", ONE_RANK) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host 'cuda' is a valid choice")
def test_cuda_without_a_gpu_is_one_line_naming_the_fix(trained):
    _, state, _ = trained
    with pytest.raises(UserError, match="--device cpu"):
        predict.rank_device(state, "cuda", ONE_RANK)


def test_a_cpu_pool_refuses_cuda_in_one_line():
    with pytest.raises(UserError, match="--procs 2 runs a CPU pool"):
        predict.PredictOptions(checkpoint="m.pt", out="p.pt", procs=2, device="cuda")
    assert predict.parse_args(["--checkpoint", "m.pt", "--out", "p.pt", "--device", "cpu"]).device == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: only a GPU proves the model and "
                    "batches really move there and the outputs come back to CPU for the gather")
def test_on_a_gpu_the_outputs_match_cpu_and_come_back_on_cpu(trained):
    config, state, expected = trained
    # rank_device's CUDA branch gathers every rank's GPU view through Horovod: tests/one_rank territory.
    outputs = predict.predict_split(state, config, "val", 0, 1, 8, torch.device("cuda", 0))
    assert outputs.device == torch.device("cpu")
    torch.testing.assert_close(outputs, expected, atol=1e-4, rtol=1e-4)
