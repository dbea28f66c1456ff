"""Tier 1: the config dataclass, YAML loading and overrides (no Horovod)."""
from __future__ import annotations

import re

import pytest

from hvdtrain.config.train_config import TrainConfig, load_config, parse_overrides, to_yaml
from hvdtrain.errors import ConfigError


def test_defaults_are_a_valid_job():
    config = load_config()
    assert config == TrainConfig()
    assert config.model == "cnn" and config.dataset == "digits"


def test_yaml_then_cli_overrides_then_types(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("batch-size: 16\nlr: 1\nmodel: cnn\nsynthetic_shape: [3, 8, 8]\n")
    config = load_config(str(path), ["--batch-size", "64", "--lr-scaling=sqrt", "--epochs", "3"])
    assert config.batch_size == 64          # the command line wins over the file
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.model == "cnn" and config.lr_scaling == "sqrt" and config.epochs == 3
    assert config.synthetic_shape == (3, 8, 8)


def test_cli_tuple_and_round_trip_through_yaml(tmp_path):
    config = load_config(None, ["--synthetic-shape", "1,4,4"])
    assert config.synthetic_shape == (1, 4, 4)
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(config))
    assert load_config(str(saved)) == config


@pytest.mark.parametrize("args, message", [
    (["--batch-sise", "8"], "unknown config key 'batch_sise' (did you mean 'batch_size'?)"),
    (["--batch-size", "eight"], "batch_size must be an integer, got 'eight'"),
    (["--batch-size", "0"], "batch_size must be > 0"),
    (["--lr", "-1"], "lr must be > 0"),
    (["--lr-scaling", "cubic"], "lr_scaling must be one of none, linear, sqrt; got 'cubic'"),
    (["--val-fraction", "1.5"], "val_fraction must be between 0 and 1"),
    (["--epochs"], "--epochs needs a value"),
    (["epochs", "3"], "expected --key value, got 'epochs'"),
    (["--synthetic-shape", "1,x"], "synthetic_shape must be comma-separated integers"),
])
def test_bad_overrides_name_the_value_and_the_fix(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, args)
    assert message in str(err.value)


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 3\nlr: [0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+: YAML syntax error"):
        load_config(str(bad))
    wrong_type = tmp_path / "wrong.yaml"
    wrong_type.write_text("epochs: three\n")
    with pytest.raises(ConfigError, match="epochs must be an integer, got 'three'"):
        load_config(str(wrong_type))
    as_list = tmp_path / "list.yaml"
    as_list.write_text("- epochs\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(str(as_list))


def test_bool_is_not_an_integer(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("epochs: true\n")
    with pytest.raises(ConfigError, match="epochs must be an integer, got True"):
        load_config(str(path))


def test_parse_overrides_accepts_both_spellings():
    assert parse_overrides(["--max-steps", "5", "--log_interval=2"]) == {"max_steps": "5", "log_interval": "2"}


@pytest.mark.parametrize("values, message", [
    ({"stages": 0}, "stages must be > 0, got 0"),
    ({"micro_batches": 4}, "micro_batches 4 needs a model split into stages"),
    ({"stages": 2, "stage_split": (3,)}, "stage_split must give a positive layer count for each of the 2 stages"),
    ({"workers": -1}, "workers must be >= 0, got -1"),
    ({"mp_context": "threads"}, "mp_context must be one of forkserver, spawn, fork; got 'threads'"),
])
def test_parallelism_fields_are_validated(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**values)


def test_stage_split_from_the_command_line_and_back():
    config = load_config(None, ["--stages", "2", "--stage-split", "3,5", "--micro-batches", "4"])
    assert config.stage_split == (3, 5) and to_yaml(config).count("stage_split") == 1
    assert load_config(None, ["--stage-split", ""]).stage_split == ()
