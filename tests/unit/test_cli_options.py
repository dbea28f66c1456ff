"""Options declared once: every subcommand's flags are generated from its options dataclass, and
`hvdtrain --help` from the subcommands' own parsers."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from support.paths import ROOT

from hvdtrain.cli import compress, hosts, predict, spark, tune
from hvdtrain.cli.args import Parser
from hvdtrain.cli.main import SUBCOMMANDS, main
from hvdtrain.cli.option_flags import add_options, flags, values
from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.config.fields import option
from hvdtrain.errors import UserError
from hvdtrain.train.run_start import report_crash
from hvdtrain.tuning.tune_settings import TuneSettings

# (options dataclass, the subcommand parser its flags live in, fields the CLI leaves to the Python API)
DECLARED = [
    (TuneSettings, tune.parser(), ()),
    (CompressOptions, compress.parser(), ("verbose",)),
    (predict.PredictOptions, predict.parser(), ()),
    (spark.SparkOptions, spark.parser(), ()),
]


@pytest.mark.parametrize("cls, parser, skipped", DECLARED, ids=lambda value: getattr(value, "__name__", ""))
def test_every_field_has_exactly_one_flag_with_the_dataclass_default(cls, parser, skipped):
    for item in dataclasses.fields(cls):
        actions = [action for action in parser._actions if action.dest == item.name]
        if item.name in skipped:
            assert not actions, item.name
            continue
        assert len(actions) == 1, (item.name, [a.option_strings for a in actions])
        assert actions[0].option_strings[:len(flags(item))] == list(flags(item)), item.name  # then --no-x
        if actions[0].required:
            assert item.default is dataclasses.MISSING or item.name == "method", item.name
        else:
            assert actions[0].default == item.default, item.name
        assert item.metadata["help"].split(";")[0] in (actions[0].help or "").replace("%%", "%"), item.name


def test_parsed_defaults_build_the_same_options_as_the_python_api():
    parsed = tune.parser().parse_known_args(["--space", "s.yaml", "--trials", "3"])[0]
    assert TuneSettings(**values(parsed, TuneSettings)) == TuneSettings(trials=3)
    parsed = compress.parser().parse_args(["run", "--method", "int8"])
    assert CompressOptions(**values(parsed, CompressOptions)) == CompressOptions()
    for action in ("check", "from-env"):
        parsed = hosts.parser().parse_args([action, "FILE"][:2 if action == "check" else 1])
        assert hosts.HostsOptions(**values(parsed, hosts.HostsOptions)) == hosts.HostsOptions()


def test_types_come_from_the_annotations():
    parsed = compress.parser().parse_args(["run", "--method", "prune", "--no-baseline", "--compile",
                                           "--batch-sizes", "2,8", "--sparsity", "0.25", "--repeats", "3"])
    options = values(parsed, CompressOptions)
    assert options["baseline"] is False and options["compiled"] is True
    assert options["batch_sizes"] == (2, 8) and options["sparsity"] == 0.25 and options["repeats"] == 3
    parsed, rest = tune.parser().parse_known_args(["--space", "s", "--trials", "2", "--pruner-startup", "5",
                                                   "--sampler-seed", "7", "--seed", "1"])
    assert TuneSettings(**values(parsed, TuneSettings)) == TuneSettings(trials=2, startup_trials=5, seed=7)
    assert rest == ["--seed", "1"]  # the training seed: a config key, not the sampler's


@pytest.mark.parametrize("args, message", [
    (["--sparsity", "nan"], "argument --sparsity: must be a finite number, got 'nan'"),
    (["--repeats", "many"], "argument --repeats: must be an integer, got 'many'"),
    (["--batch-sizes", "1,x"], "argument --batch-sizes: must be comma-separated integers like 1,64, got '1,x'"),
    (["--int8-mode", "int4"], "argument --int8-mode: invalid choice: 'int4'"),
])
def test_a_bad_value_is_one_user_error_naming_the_flag(args, message):
    with pytest.raises(UserError, match=None) as err:
        compress.parser().parse_args(["run", "--method", "int8", *args])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_dataclass_checks_the_values_the_cli_parsed():
    parsed = predict.parser().parse_args(["--checkpoint", "m.pt", "--out", "p.csv"])
    with pytest.raises(UserError, match="--out p.csv must end in .pt or .npy"):
        predict.PredictOptions(**values(parsed, predict.PredictOptions))


def test_a_field_without_help_cannot_become_a_flag():
    @dataclasses.dataclass(frozen=True)
    class Undocumented:
        size: int = 3

    with pytest.raises(TypeError, match="Undocumented.size has no help"):
        add_options(Parser("hvdtrain x"), Undocumented)
    with pytest.raises(TypeError, match="needs its one-line help"):
        option(3)


def test_help_lists_every_subcommand_with_its_summary(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"    {name} " in text, name
    assert "a smaller, faster model of a finished run" in text and "--batch-size " in text  # train's config keys
    assert main(["help"]) == 0 and capsys.readouterr().out == text


def test_a_subcommand_help_shows_every_field_help(capsys):
    assert main(["compress", "--help"]) == 0
    text = "".join(capsys.readouterr().out.split())  # argparse wraps help lines, also at hyphens
    for item in dataclasses.fields(CompressOptions):
        if item.name != "verbose":
            assert "".join(item.metadata["help"].split()) in text, item.name
    assert "--baseline,--no-baseline" in text and "(default:1,64)" in text


def test_help_imports_no_torch_horovod_or_optuna():
    code = ("import sys; from hvdtrain.cli.main import main; assert main(['--help']) == 0; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod', 'optuna')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr


def test_launch_keeps_horovodrun_arguments_and_help_is_generated(capsys):
    assert main(["launch", "--help"]) == 0
    assert "HOROVODRUN_ARGS" in capsys.readouterr().out
    assert main(["launch"]) == 2
    assert capsys.readouterr().err.strip().startswith("hvdtrain: error: launch: needs horovodrun's arguments")


@pytest.mark.parametrize("env, rank", [({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, 3),
                                       ({"PMI_RANK": "1", "PMI_SIZE": "2"}, 1), ({}, 0)])
def test_a_crash_report_names_the_rank_the_launcher_gave(monkeypatch, capsys, env, rank):
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        raise RuntimeError("boom")
    except RuntimeError as err:
        assert report_crash(err) == 1
    assert f"rank {rank} failed: RuntimeError: boom" in capsys.readouterr().err


@pytest.mark.parametrize("rank, warned", [("0", True), ("1", False)])
def test_a_credential_on_the_command_line_is_warned_about_once_per_job(monkeypatch, capsys, rank, warned):
    from hvdtrain.cli.main import _take_secrets

    for name, value in {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_RANK": rank, "HOROVOD_SIZE": "2",
                        "HF_TOKEN": "x"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HVDTRAIN_SECRETS_FILE", raising=False)
    _take_secrets()
    assert ("HF_TOKEN reached the workers" in capsys.readouterr().err) == warned
