"""Tier 1: torch.compile'd models save and load as the plain model; bf16 tensors travel as float32.

No forward pass here (nothing is compiled, so these run in well under a second); compiled training is in
tests/one_rank/test_compiled.py and tests/multirank/test_compiled_multirank.py.
"""
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from hvdtrain.config.train_config import load_config
from hvdtrain.distributed.wire import Bf16AsFp32
from hvdtrain.errors import ConfigError
from hvdtrain.models.compiled import compile_model, is_compiled, regions
from hvdtrain.models.zoo import resnet18
from hvdtrain.output.plain_weights import load_plain_state, plain, plain_state_dict
from hvdtrain.output.run_log import write_weights
from hvdtrain.train.evaluation import param_digest


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


@pytest.mark.parametrize("how", ["torch.compile", "compile_model"])
def test_a_compiled_models_weights_files_load_into_the_plain_model_strictly(tmp_path, how):
    compiled = torch.compile(net()) if how == "torch.compile" else compile_model(net())
    if how == "torch.compile":
        assert all(key.startswith("_orig_mod.") for key in compiled.state_dict())  # what torch.save would write
    else:  # compiled in place, block by block: the plain model's keys
        assert sorted(compiled.state_dict()) == sorted(net().state_dict())
    write_weights(tmp_path, "model", compiled)
    for state in (torch.load(tmp_path / "model.pt", weights_only=True), load_file(tmp_path / "model.safetensors")):
        fresh = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
        fresh.load_state_dict(state, strict=True)
        for key, value in net().state_dict().items():
            assert torch.equal(fresh.state_dict()[key], value), key


def test_a_compiled_submodule_inside_a_container_saves_plain_keys():
    model = nn.Sequential(torch.compile(nn.Linear(4, 3)), nn.Linear(3, 2))
    assert "0._orig_mod.weight" in model.state_dict()
    assert sorted(plain_state_dict(model)) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)).load_state_dict(plain_state_dict(model), strict=True)


@pytest.mark.parametrize("saved_compiled", [True, False])
@pytest.mark.parametrize("into_compiled", [True, False])
def test_weights_load_strictly_whichever_side_was_compiled(saved_compiled, into_compiled):
    """Files written before this fix hold `_orig_mod.` keys; a compiled run resumes from plain files."""
    source = net()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    state = (torch.compile(source) if saved_compiled else source).state_dict()
    target = compile_model(net()) if into_compiled else net()
    result = load_plain_state(target, state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for key, value in source.state_dict().items():
        assert torch.equal(plain(target).state_dict()[key], value), key


def test_a_key_the_model_lacks_is_still_named_by_a_strict_load():
    with pytest.raises(RuntimeError, match="nope"):
        load_plain_state(compile_model(net()), {**net().state_dict(), "nope": torch.zeros(1)})


def test_compiling_twice_keeps_one_wrapper():
    once = compile_model(net())
    assert compile_model(once) is once


def test_compile_model_compiles_each_block_with_parameters_in_place():
    model = net()
    assert compile_model(model) is model and is_compiled(model)
    compiled = [name for name, m in model.named_modules() if m._compiled_call_impl is not None]
    assert compiled == ["0", "1", "2"]   # each its own graph, so each its own backward; not the Sequential


def test_regions_are_resnet18s_blocks_and_look_through_a_wrapper_and_a_module_list():
    body = resnet18(3, 10, width=4)
    assert [type(m).__name__ for m in regions(body)] == ["Conv2d", "BatchNorm2d", *["_Block"] * 8, "Linear"]

    class Wrapper(nn.Module):   # all parameters in one child: its blocks are the regions
        def __init__(self) -> None:
            super().__init__()
            blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.inner = nn.ModuleDict({"stem": nn.Linear(2, 4), "blocks": blocks})

    found = regions(Wrapper())
    assert len(found) == 3 and all(isinstance(m, nn.Linear) for m in found)
    stack = nn.Module()   # an encoder: its layers in a ModuleList, then a norm
    stack.layers, stack.norm = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), nn.LayerNorm(4)
    model = nn.Sequential(nn.Embedding(8, 4), stack, nn.Linear(4, 2))
    assert regions(model) == [model[0], stack.layers[0], stack.layers[1], stack.norm, model[2]]
    assert regions(nn.Linear(2, 2)) == []   # no blocks: compile_model compiles the model itself
    leaf = nn.Linear(2, 2)
    assert compile_model(leaf) is leaf and leaf._compiled_call_impl is not None


def test_a_model_the_user_compiled_stays_one_graph_with_one_note(capsys):
    from hvdtrain.models import compiled

    compiled._TOLD.clear()
    mine = torch.compile(net())
    assert compile_model(mine, note=False) is mine and not capsys.readouterr().err   # ranks other than 0
    assert compile_model(mine) is mine and compile_model(torch.compile(net())) is not mine
    assert not any(m._compiled_call_impl is not None for m in mine._orig_mod.modules())
    err = capsys.readouterr().err
    assert err.count("hvdtrain: note:") == 1 and "no overlap" in err and "--compile true" in err, err
    compiled._TOLD.clear()


def test_the_examples_in_compiled_run():
    import doctest

    from hvdtrain.models import compiled

    result = doctest.testmod(compiled)
    assert result.attempted and not result.failed


def test_compile_is_a_validated_option():
    assert load_config(overrides=["--compile", "true"]).compile is True
    with pytest.raises(ConfigError, match="compile is not supported with stages 2"):
        load_config(compile=True, stages=2)


def test_bf16_gradients_travel_as_fp32_and_come_back_as_bf16():
    grad = torch.randn(5).to(torch.bfloat16)
    wire, ctx = Bf16AsFp32.compress(grad)
    assert wire.dtype == torch.float32 and torch.equal(wire.to(torch.bfloat16), grad)
    back = Bf16AsFp32.decompress(wire, ctx)
    assert back.dtype == torch.bfloat16 and torch.equal(back, grad)
    other = torch.randn(5)
    assert Bf16AsFp32.compress(other) == (other, None) and Bf16AsFp32.decompress(other, None) is other


def test_the_weight_digest_reads_bf16_and_scalars():
    model = net().to(torch.bfloat16)
    assert param_digest(model) == param_digest(model) != param_digest(net())
    assert param_digest(net()) == param_digest(net())  # the fp32 digest: the same bytes as before


def test_the_examples_in_plain_weights_run():
    import doctest

    from hvdtrain.output import plain_weights

    result = doctest.testmod(plain_weights)
    assert result.attempted and not result.failed
