"""Tier 2: --compile on one in-process worker: its files load into the plain model, and a resumed compiled run
equals the uninterrupted one (resumed into a plain model too, to compile's float tolerance).

Slow on a loaded CPU the first time (inductor compiles C++; later runs hit its cache in /tmp).
"""
import pytest
import torch
from safetensors.torch import load_file

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.models.builtin import build_model
from hvdtrain.train.config_fit import fit
from hvdtrain.train.trainer import Trainer
from hvdtrain.trained.finished_run import read

SMALL = dict(dataset="synthetic", synthetic_samples=640, synthetic_shape=(1, 8, 8), model="mlp", hidden=32,
             lr=0.05, warmup_epochs=0, max_steps=12, batch_size=32, threads=1, tensorboard=False,
             checkpoint_steps=4, keep_checkpoints=9)


def test_a_compiled_runs_files_load_strictly_and_its_resume_equals_the_uninterrupted_run(tmp_path, one_worker):
    base = dict(SMALL, run_dir=str(tmp_path))
    whole = fit(load_config(**base, compile=True, name="whole"))
    assert whole.summary["steps"] == 12
    config = load_config(**base)
    data = build_data(config)
    run = tmp_path / "whole"
    middle = run / "checkpoints" / "ckpt-000000004.pt"
    files = {"model.pt": torch.load(run / "model.pt", weights_only=True),
             "model.safetensors": load_file(run / "model.safetensors"),
             "checkpoint": checkpoint.load(middle)["model"]}
    for name, state in files.items():
        assert not any("_orig_mod" in key for key in state), name
        plain = build_model(config, input_shape(data.train), data.num_classes)
        plain.load_state_dict(state, strict=True)

    # As if killed after step 4: the compiled resume is the uninterrupted compiled run, bit for bit.
    fit(load_config(**base, compile=True, name="cut", resume=str(middle)))
    cut = torch.load(tmp_path / "cut" / "model.pt", weights_only=True)
    for key, value in files["model.pt"].items():
        assert torch.equal(cut[key], value), key
    # The same checkpoint into the plain model: eager kernels round differently from compiled ones.
    fit(load_config(**base, name="eager", resume=str(middle)))
    eager = torch.load(tmp_path / "eager" / "model.pt", weights_only=True)
    for key, value in files["model.pt"].items():
        torch.testing.assert_close(eager[key], value, atol=1e-5, rtol=0)


@pytest.mark.parametrize("compiled", [True, False])
def test_files_written_with_compile_prefixes_still_resume_and_rebuild(tmp_path, one_worker, compiled):
    """Files written before the fix hold `_orig_mod.` keys: a resume (compiled or not) and read() take them."""
    base = dict(SMALL, run_dir=str(tmp_path))
    fit(load_config(**dict(base, max_steps=4), name="old"))
    old = tmp_path / "old"
    path = old / "checkpoints" / "ckpt-000000004.pt"
    payload = checkpoint.load(path)
    payload["model"] = {f"_orig_mod.{key}": value for key, value in payload["model"].items()}
    torch.save(payload, path)
    weights = torch.load(old / "model.pt", weights_only=True)
    torch.save({f"_orig_mod.{key}": value for key, value in weights.items()}, old / "model.pt")
    resumed = fit(load_config(**dict(base, max_steps=6), compile=compiled, name="new", resume=str(path)))
    assert resumed.summary["steps"] == 6
    rebuilt = read(old).model.state_dict()
    for key, value in weights.items():
        assert torch.equal(rebuilt[key], value), key


def test_a_model_the_user_compiled_trains_as_one_graph_with_one_note(tmp_path, one_worker, capsys):
    config = load_config(**SMALL, run_dir=str(tmp_path), name="mine")
    data = build_data(config)
    plain = build_model(config, input_shape(data.train), data.num_classes)
    mine = torch.compile(plain)
    with Trainer(mine, data.train, data.val, config=config) as trainer:
        assert trainer.model is mine    # kept as it is: not recompiled block by block
        trainer.fit()
    err = capsys.readouterr().err
    assert err.count("one graph: its gradient allreduces all start when its backward ends") == 1, err
    assert not any(m._compiled_call_impl is not None for m in plain.modules())
    build_model(config, input_shape(data.train), data.num_classes).load_state_dict(
        torch.load(tmp_path / "mine" / "model.pt", weights_only=True), strict=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled graphs of one test are not the next test's business."""
    yield
    torch._dynamo.reset()
