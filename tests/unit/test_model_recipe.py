"""models/recipe.py: how a run records a model that was not built from its config (model.json), the rule for
constructor arguments, every reason a model cannot be rebuilt, and finished_run rebuilding from the record."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support.paths import ROOT
from support.processes import show
from torch import nn
from user_models import TinyEncoder, TwoHeads, WideMLP  # noqa: E402

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.config.train_config import load_config, to_yaml
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.errors import UserError
from hvdtrain.models import recipe
from hvdtrain.models.builtin import build_model, recipe_for
from hvdtrain.output.run_directory import RunDirectory, RunDirSettings
from hvdtrain.trained import finished_run


class KeepsAModule(nn.Module):
    def __init__(self, head: int = 3) -> None:
        super().__init__()
        self.head = nn.Linear(4, head)


class KeepsATensor(nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.scale = scale


class TakesKwargs(nn.Module):
    def __init__(self, **options: int) -> None:
        super().__init__()
        self.options = options


class ByProperty(nn.Module):
    """Reads its argument back through a property: accepted, it is what __init__ was given."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(2, width)

    @property
    def width(self) -> int:
        return self.fc.out_features


def test_a_class_that_keeps_its_arguments_is_recorded_by_import_path_and_literal_arguments():
    record = recipe.describe(WideMLP(24, depth=3, activation="gelu"))
    assert record.cls == "user_models:WideMLP" and not record.why_not and record.name == "widemlp"
    assert record.args == {"width": "24", "depth": "3", "classes": "10", "activation": "'gelu'", "inputs": "64"}
    assert record.call == "user_models:WideMLP(width=24, depth=3, classes=10, activation='gelu', inputs=64)"
    assert recipe.describe(TwoHeads()).args == {} and not recipe.describe(TwoHeads()).why_not
    assert recipe.describe(ByProperty(7)).args == {"width": "7"}
    assert record.source == str(ROOT / "tests" / "plugins" / "user_models.py")


def local_model() -> nn.Module:
    class Local(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x
    return Local()


@pytest.mark.parametrize("model, why", [
    (TinyEncoder(16), "TinyEncoder.__init__ takes `width`, which the model does not keep as self.width"),
    (KeepsAModule(), "self.head is a Linear, not a plain value"),
    (KeepsATensor(torch.ones(2)), "self.scale is a Tensor, not a plain value"),
    (TakesKwargs(a=1), "TakesKwargs.__init__ takes **options, whose values are not kept"),
    (nn.Sequential(nn.Linear(2, 2)), "Sequential.__init__ takes *args, whose values are not kept"),
    (local_model(), "its class local_model.<locals>.Local is defined inside a function"),
])
def test_a_model_that_cannot_be_rebuilt_is_recorded_with_the_reason(model, why):
    record = recipe.describe(model)
    assert record.why_not.startswith(why) and record.args == {}, record
    with pytest.raises(UserError) as err:
        record.build("runs/x")
    text = str(err.value)
    assert text.startswith(f"runs/x was trained with the model {record.cls}, which hvdtrain cannot rebuild: {why}")
    assert text.endswith(recipe.FIX) and "\n" not in text


def test_a_class_of_a_script_run_as_main_cannot_be_imported_elsewhere(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent("""
        from torch import nn
        from hvdtrain.models.recipe import describe

        class Net(nn.Module):
            def __init__(self, width=3):
                super().__init__()
                self.width = width
                self.fc = nn.Linear(2, width)

        print(describe(Net()).why_not)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.strip() == ("its class Net is defined in __main__ (a script or notebook), which another "
                                   "process cannot import: move it into a module")
    # The same file run as `python -m train_script` is importable under that name: rebuildable.
    proc = subprocess.run([sys.executable, "-m", "train_script"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "", show(proc)


def test_model_json_round_trips_and_rebuilds_the_same_architecture(tmp_path):
    model = WideMLP(12, depth=2, activation="gelu")
    recipe.describe(model).write(tmp_path)
    back = recipe.read(tmp_path)
    assert back == recipe.describe(model)
    rebuilt = back.build(tmp_path)
    assert type(rebuilt) is WideMLP and rebuilt.load_state_dict(model.state_dict()) is not None
    assert [type(m) for m in rebuilt.modules()] == [type(m) for m in model.modules()]
    assert recipe.read(tmp_path / "elsewhere") is None


def test_a_damaged_or_foreign_model_json_is_one_line(tmp_path):
    (tmp_path / "model.json").write_text('{"format": "other/9", "class": "x:Y", "args": {}}')
    with pytest.raises(UserError, match=r"model.json is not a model record hvdtrain wrote \(format 'other/9'"):
        recipe.read(tmp_path)
    recipe.ModelRecipe("no_such_module_here:Net").write(tmp_path)
    with pytest.raises(UserError, match=r"cannot import no_such_module_here .*put its folder on PYTHONPATH, or pass "
                                        r"--model module:function"):
        recipe.read(tmp_path).build(tmp_path)


def test_only_a_model_not_built_from_the_config_is_recorded():
    config = load_config(model="mlp", hidden=8, run_dir="runs")
    built = build_model(config, (1, 8, 8), 10)
    assert recipe_for(built, config) is None                                   # config.yaml rebuilds it
    assert recipe_for(built, load_config(model="mlp", run_dir="")) is None     # nothing written
    assert recipe_for(built, load_config(model="cnn", run_dir="runs")).cls.endswith(":Sequential")
    assert recipe_for(copy.deepcopy(built), config).cls.endswith(":Sequential")   # a copy may be changed


def test_the_run_folder_records_the_class_in_config_yaml_and_is_named_after_it():
    config = load_config(run_dir="runs")
    run = RunDirectory(RunDirSettings.of(config))
    assert run.settings.stem == "cnn-digits"
    run.record(config, recipe_for(WideMLP(8), config))
    assert run.settings.stem == "widemlp-digits" and run.settings.record.model == "user_models:WideMLP"
    run.record(config, None)
    assert run.settings.stem == "cnn-digits" and run.settings.record.model == "cnn"


def test_a_model_class_is_not_taken_for_a_builder():
    with pytest.raises(UserError, match=r"model user_models:WideMLP is a model class, not a builder: --model takes "
                                        r"a function \(config, input_shape, num_classes\)"):
        build_model(load_config(model="user_models:WideMLP"), (1, 8, 8), 10)


def saved_run(path: Path, model: nn.Module, *, record: bool = True) -> Path:
    """A run folder as a Trainer given `model` leaves it: config.yaml naming the class, model.pt, model.json."""
    config = load_config(model=recipe.describe(model).cls)
    path.mkdir()
    (path / "config.yaml").write_text(to_yaml(config))
    torch.save(model.state_dict(), path / "model.pt")
    if record:
        recipe.describe(model).write(path)
    return path


def test_finished_run_rebuilds_the_recorded_class_with_its_arguments(tmp_path):
    torch.manual_seed(0)
    model = WideMLP(20, depth=3).eval()
    run = finished_run.read(saved_run(tmp_path / "wide", model))
    assert type(run.model) is WideMLP and run.model.width == 20 and run.model.depth == 3
    assert run.model_record is not None and run.model_record.cls == "user_models:WideMLP"
    inputs = torch.rand(5, 1, 8, 8)
    torch.testing.assert_close(run.model(inputs), model(inputs), atol=0, rtol=0)


def test_a_checkpoint_of_the_run_is_rebuilt_from_the_runs_record(tmp_path):
    """A checkpoint carries the Trainer's own config (model: cnn, the default): model.json beside checkpoints/ wins."""
    torch.manual_seed(2)
    model = WideMLP(10).eval()
    path = saved_run(tmp_path / "wide", model)
    saved = checkpoint.save(checkpoint.checkpoint_dir(path), 3, {"model": model.state_dict(),
                                                                 "config": load_config().to_dict()}, keep=1)
    run = finished_run.read(saved)
    assert type(run.model) is WideMLP and run.path == path and run.config.model == "cnn"
    inputs = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(run.model(inputs), model(inputs), atol=0, rtol=0)


def test_a_record_that_does_not_fit_the_weights_is_an_error_not_another_model(tmp_path):
    path = saved_run(tmp_path / "wide", WideMLP(20))
    recipe.describe(WideMLP(21)).write(path)          # a wrong width: the weights must not load
    with pytest.raises(UserError) as err:
        finished_run.read(path)
    text = str(err.value)
    assert text.startswith(f"{path}/model.pt does not fit user_models:WideMLP(width=21, depth=2, classes=10, "
                           "activation='relu', inputs=64), rebuilt from model.json: ") and text.endswith(recipe.FIX)


def test_without_a_record_a_class_in_config_yaml_is_refused_and_a_builder_is_taken(tmp_path):
    torch.manual_seed(1)
    model = TinyEncoder(16)
    path = saved_run(tmp_path / "enc", model, record=False)
    with pytest.raises(UserError, match="is a model class, not a builder"):
        finished_run.read(path)
    run = finished_run.read(path, model="user_models:tiny_encoder")
    data = build_data(run.config)
    assert input_shape(data.train) == run.input_shape and run.model_record is None
    inputs = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(run.model(inputs), model.eval()(inputs), atol=0, rtol=0)
