"""hvdtrain tune without a launcher: the search space, settings, the study on disk (real Optuna), the report,
bad input through the real command line (one line, exit 2, nothing written), and a train_fn's trials on one
real Horovod worker in this process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support.paths import ROOT
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain
from hvdtrain.config.train_config import load_config, to_yaml
from hvdtrain.errors import ConfigError, UserError
from hvdtrain.tuning.job_runner import job_command
from hvdtrain.tuning.space import check_against, load_space, parse_space, trial_config
from hvdtrain.tuning.study import open_study, write_trials_json
from hvdtrain.tuning.study_report import results_table, write_best, write_plots
from hvdtrain.tuning.train_fn import reference_of
from hvdtrain.tuning.tune_settings import TuneSettings

SPACE = {"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True},
         "batch_size": {"type": "categorical", "choices": [16, 32, 64]},
         "hidden": {"type": "int", "low": 64, "high": 256, "step": 64},
         "synthetic_shape": {"type": "categorical", "choices": [[1, 8, 8], "1,16,16"]},
         "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]}}


def test_a_space_parses_in_file_order_with_optuna_distributions():
    space = parse_space(SPACE)
    assert list(space) == list(SPACE)
    lr = space["lr"].distribution()
    assert (lr.low, lr.high, lr.log) == (0.01, 0.3, True)
    hidden = space["hidden"].distribution()
    assert (hidden.low, hidden.high, hidden.step) == (64, 256, 64)
    assert space["batch_size"].distribution().choices == (16, 32, 64)
    # Tuple-valued keys travel as "1,8,8" (Optuna keeps plain scalars) and come back as tuples per trial.
    assert space["synthetic_shape"].choices == ("1,8,8", "1,16,16")
    config = trial_config(load_config(), {"synthetic_shape": "1,16,16", "lr": 0.1}, name="trial-0001")
    assert config.synthetic_shape == (1, 16, 16) and config.lr == 0.1 and config.name == "trial-0001"


def test_keys_are_written_with_dashes_or_underscores(tmp_path):
    file = tmp_path / "space.yaml"
    file.write_text("batch-size: {type: int, low: 16, high: 64}\n")
    assert list(load_space(str(file))) == ["batch_size"]


@pytest.mark.parametrize("space, message", [
    ({"lrr": {"type": "float", "low": 0.1, "high": 1}}, "unknown config key 'lrr' (did you mean 'lr'?)"),
    ({"run_dir": {"type": "categorical", "choices": ["a", "b"]}}, "run_dir: cannot be searched"),
    ({"lr": {"type": "uniform", "low": 0.1, "high": 1}}, "unknown distribution type 'uniform'"),
    ({"lr": {"low": 0.1, "high": 1}}, "must be a mapping with a type"),
    ({"lr": [0.1, 1]}, "must be a mapping with a type"),
    ({"lr": {"type": "float", "low": 0.5, "high": 0.1}}, "empty range: low 0.5 must be below high 0.1"),
    ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "empty range"),
    ({"lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "a log range needs low > 0"),
    ({"lr": {"type": "float", "low": "a", "high": 1}}, "low must be a number, got 'a'"),
    ({"lr": {"type": "float", "low": 0.1, "high": 1, "scale": "log"}}, "unknown field(s) scale for type float"),
    ({"lr": {"type": "int", "low": 1, "high": 3}}, "lr: is of type float, so a int range cannot set it"),
    ({"batch_size": {"type": "float", "low": 1, "high": 3}}, "so a float range cannot set it (use type int)"),
    ({"batch_size": {"type": "int", "low": 16, "high": 64.5}}, "high must be an integer for type int"),
    ({"batch_size": {"type": "int", "low": 16, "high": 60, "step": 16}}, "must be a multiple of step 16"),
    ({"batch_size": {"type": "categorical", "choices": []}}, "choices must be a non-empty list"),
    ({"batch_size": {"type": "categorical", "choices": [16, "x"]}}, "batch_size must be an integer, got 'x'"),
    ({"batch_size": {"type": "categorical", "choices": [16, 16]}}, "choices repeat a value"),
    ({}, "must be a non-empty mapping"),
])
def test_bad_spaces_are_config_errors_naming_the_key(space, message):
    with pytest.raises(ConfigError, match=None) as err:
        parse_space(space)
    assert message in str(err.value)


def test_bounds_are_checked_against_the_config_before_any_trial():
    space = parse_space({"lr": {"type": "float", "low": 0.0, "high": 0.1}})
    with pytest.raises(ConfigError, match="lr = 0.0 makes an invalid config: lr must be > 0"):
        check_against(space, load_config())
    space = parse_space({"optimizer": {"type": "categorical", "choices": ["sgd", "lion"]}})
    with pytest.raises(ConfigError, match="optimizer must be one of sgd, adam, adamw"):
        check_against(space, load_config())


@pytest.mark.parametrize("options, message", [
    ({"trials": 0}, "trials must be >= 1"),
    ({"trials": 2, "mode": "threads"}, "mode must be one of job, inprocess"),
    ({"trials": 2, "metric": "acc"}, "metric must be one of val_acc, val_loss"),
    ({"trials": 2, "pruner": "asha"}, "pruner must be one of median, hyperband, none"),
    ({"trials": 2, "mode": "inprocess", "parallel": 2}, "inprocess mode runs one trial at a time"),
])
def test_bad_settings(options, message):
    with pytest.raises(ConfigError, match=message):
        TuneSettings(**options)


def test_a_killed_run_leaves_running_trials_that_the_next_run_fails_and_queues_again(tmp_path):
    settings = TuneSettings(trials=3, dir=str(tmp_path / "tune"), sampler="random")
    space = parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}})
    study = open_study(settings)
    done = study.ask(space, {})
    study.optuna.tell(done, 0.9)
    left = study.ask(space, {})             # as if the process died here: RUNNING forever
    with pytest.raises(UserError, match="another hvdtrain tune is running on"):
        open_study(settings)                # the directory is taken while a process drives it
    study.close()

    again = open_study(settings)
    assert again.recovered == [left.number]
    states = {t.number: t.state.name for t in again.optuna.trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "WAITING"}
    assert "interrupted" in again.optuna.trials[1].user_attrs["error"]
    assert again.finished() == 1 and again.remaining() == 2      # the failed one does not count
    retry = again.ask(space, {})
    assert retry.number == 2 and retry.params == left.params      # the same parameters, run again
    assert again.optuna.trials[2].user_attrs["retry_of"] == 1
    again.close()


def test_report_writes_best_yaml_from_the_trial_config_and_says_why_importance_is_missing(tmp_path):
    settings = TuneSettings(trials=2, dir=str(tmp_path / "tune"))
    study = open_study(settings)
    space = parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}})
    trial = study.ask(space, {"world_size": 2, "lr_scale": 2.0, "lr_scaling": "linear"})
    run = tmp_path / "tune" / "trials" / "trial-0000"
    run.mkdir(parents=True)
    trained = trial_config(load_config(model="mlp", seed=7), trial.params, run_dir=str(run.parent),
                           name="trial-0000")
    (run / "config.yaml").write_text(to_yaml(trained))
    trial.set_user_attr("run_dir", str(run))
    study.optuna.tell(trial, 0.97)

    best = write_best(study.optuna, settings, "runs")
    assert best is not None
    text = best.read_text()
    assert text.startswith("# hvdtrain tune: best of study") and "horovodrun -np 2" in text
    again = load_config(str(best))
    assert again == trial_config(trained, {}, run_dir="runs", name="")      # everything else as trained
    assert yaml.safe_load(text)["seed"] == 7
    plots, notes = write_plots(study.optuna, settings)
    assert [p.name for p in plots] == ["history.png"]
    assert notes == ["parameter importance needs >= 2 complete trials (have 1): no importance.png"]
    assert "complete" in results_table(study.optuna.trials, settings)
    study.close()


def tune_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", "tune", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.parametrize("space, args, message", [
    ("lrr: {type: float, low: 0.1, high: 1}\n", [], "unknown config key 'lrr' (did you mean 'lr'?)"),
    ("lr: {type: float, low: 1, high: 0.1}\n", [], "empty range: low 1 must be below high 0.1"),
    ("lr: {type: loguniform, low: 0.1, high: 1}\n", [], "unknown distribution type 'loguniform'"),
    ("lr: {type: float, low: 0.01, high: 1}\n", ["--trials", "0"], "tune: trials must be >= 1, got 0"),
    ("lr: {type: float, low: 0.01, high: 1}\n", ["--epochz", "2"], "unknown config key 'epochz'"),
    ("lr: [0.1\n", [], "YAML syntax error"),
    ("lr: {type: float, low: 0.01, high: 1}\n", ["--train-fn", "mymod"], "train_fn must be 'module:function'"),
    ("lr: {type: float, low: 0.01, high: 1}\n", ["--train-fn", "no_such_mod_52:train"],
     "cannot import module 'no_such_mod_52' for --train-fn no_such_mod_52:train"),
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, space, args, message):
    (tmp_path / "space.yaml").write_text(space)
    before = set(tmp_path.iterdir())
    trials = [] if "--trials" in args else ["--trials", "2"]
    proc = tune_cli("--space", "space.yaml", "--dir", "study", *trials, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: ") and message in lines[0], proc.stderr
    assert set(tmp_path.iterdir()) == before


def test_cli_needs_a_space(tmp_path):
    proc = tune_cli("--trials", "2", cwd=tmp_path)
    assert proc.returncode == 2 and "the following arguments are required: --space" in proc.stderr


def test_the_python_api_is_hvdtrain_tune_and_loads_lazily():
    code = ("import sys, hvdtrain; assert 'optuna' not in sys.modules and 'torch' not in sys.modules; "
            "from hvdtrain.tuning.tune_api import tune; assert hvdtrain.tune is tune; "
            "import hvdtrain.tuning.space; assert hvdtrain.tune is tune; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.strip() == "ok", proc.stderr


def test_cli_help_lists_the_tune_options_and_the_config_keys(tmp_path):
    proc = tune_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for flag in ("--space", "--trials", "--parallel", "--mode", "--pruner", "--sampler-seed", "--train-fn", "--lr "):
        assert flag in proc.stdout, flag


@pytest.mark.parametrize("sampler, pruner", [("tpe", "median"), ("random", "hyperband"), ("tpe", "none")])
def test_every_sampler_and_pruner_opens_asks_and_judges(tmp_path, sampler, pruner):
    study = open_study(TuneSettings(trials=2, dir=str(tmp_path), sampler=sampler, pruner=pruner, metric="val_loss"))
    trial = study.ask(parse_space(SPACE), {})
    trial.report(0.5, 0)
    assert trial.should_prune() in (True, False) and study.optuna.direction.name == "MINIMIZE"
    study.close()
    with pytest.raises(UserError, match="was made to minimize, not to maximize val_acc"):
        open_study(TuneSettings(trials=2, dir=str(tmp_path), sampler=sampler, pruner=pruner))


def test_job_mode_under_a_launcher_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.3}\n")
    monkeypatch.setenv("HOROVOD_RANK", "0")     # as horovodrun sets it on every worker
    proc = tune_cli("--space", "space.yaml", "--trials", "2", "--dir", "study", cwd=tmp_path)
    assert proc.returncode == 2 and "add --mode inprocess" in proc.stderr, proc.stderr
    assert not (tmp_path / "study").exists()


def test_a_second_study_in_one_dir_is_refused_in_one_line_before_writing_anything(tmp_path):
    first = open_study(TuneSettings(trials=1, dir=str(tmp_path / "tune"), study="lr-search"))
    space = parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}})
    first.optuna.tell(first.ask(space, {}), 0.9)
    write_trials_json(first)
    first.close()
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "tune").iterdir()}
    message = ("tune: --dir .*tune holds study 'lr-search', not 'wd-search': use another --dir for a new "
               "study, or --study lr-search to continue that one")
    with pytest.raises(UserError, match=message):
        open_study(TuneSettings(trials=1, dir=str(tmp_path / "tune"), study="wd-search"))
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.3}\n")
    proc = tune_cli("--space", "space.yaml", "--dir", "tune", "--study", "wd-search", "--trials", "1", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "holds study 'lr-search'" in lines[0], proc.stderr
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "tune").iterdir()} == before
    again = open_study(TuneSettings(trials=2, dir=str(tmp_path / "tune"), study="lr-search"))
    assert again.finished() == 1  # its own study continues there
    again.close()


# ---- your own model and data: train_fn (issue 52)

def tiny(config):
    """A train_fn: an unfitted Trainer of a model class hvdtrain does not know, on 4 blobs."""
    torch.manual_seed(0)
    x, y = torch.randn(96, 4), torch.arange(96) % 4
    x += nn.functional.one_hot(y, 4) * 4
    return hvdtrain.Trainer(nn.Linear(4, 4), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]),
                            config=config)


def test_a_module_function_has_a_reference_a_lambda_or_nested_one_has_none():
    def nested(config):
        return config

    assert reference_of(tiny) == f"{__name__}:tiny"
    assert reference_of(lambda config: config) is None and reference_of(nested) is None
    assert reference_of(hvdtrain.fit) == "hvdtrain.train.config_fit:fit"     # where it is defined, not re-exported


@pytest.mark.parametrize("train_fn", [lambda config: config, "nested"])
def test_job_mode_refuses_a_train_fn_a_new_process_cannot_import_before_writing_anything(tmp_path, train_fn):
    def nested(config):
        return config

    with pytest.raises(ConfigError, match="put it at the top of a module .* or use mode='inprocess'") as err:
        hvdtrain.tune({"lr": {"type": "float", "low": 0.01, "high": 0.3}}, 2, dir=str(tmp_path / "study"),
                      train_fn=nested if train_fn == "nested" else train_fn)
    assert "job mode starts each trial as a new process" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "study").exists()


def test_job_and_srun_trials_run_the_train_fn_worker_program():
    config = Path("/s/trials/trial-0003.yaml")
    program = ["-m", "hvdtrain.tuning.trial_worker", "--train-fn", "mymod:train", "--config", str(config)]
    assert job_command(config, TuneSettings(trials=2, train_fn="mymod:train"))[-7:] == [sys.executable, *program]
    assert job_command(config, TuneSettings(trials=2, train_fn="mymod:train", launcher="srun"))[-7:] == [
        sys.executable, *program]
    assert job_command(config, TuneSettings(trials=2))[-4:] == ["-m", "hvdtrain", "--config", str(config)]


def test_cli_train_fn_from_the_working_folder_without_that_function_is_one_line(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.3}\n")
    (tmp_path / "mymod.py").write_text("trian = 1\n")
    # The `hvdtrain` script, whose sys.path starts at its own folder, finds mymod where its workers will: here.
    proc = subprocess.run([str(Path(sys.executable).parent / "hvdtrain"), "tune", "--space", "space.yaml",
                           "--trials", "1", "--dir", "study", "--train-fn", "mymod:train"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "module 'mymod' (" in lines[0] and "has no function 'train' for --train-fn mymod:train" in lines[0]
    assert not (tmp_path / "study").exists()


def fitted_itself(config):
    with tiny(config) as trainer:
        trainer.fit()
    return trainer


def elsewhere(config):
    return tiny(trial_config(config, {}, name="not-the-trial"))


@pytest.mark.parametrize("train_fn, state, said", [
    (tiny, "COMPLETE", ""),
    (fitted_itself, "COMPLETE", "fitted its Trainer itself: inprocess mode cannot prune"),
    (lambda config: tiny(config).fit(), "COMPLETE", "fitted its Trainer itself"),      # its History
    (lambda config: "a model", "FAIL", "train_fn must return an hvdtrain.Trainer built with config=config"),
    (elsewhere, "FAIL", "not to the trial's"),
])
def test_inprocess_train_fn_one_worker_what_it_may_return(tmp_path, capsys, train_fn, state, said):
    result = hvdtrain.tune({"lr": {"type": "float", "low": 0.05, "high": 0.2}}, 1, train_fn=train_fn,
                           config=load_config(epochs=2, batch_size=16, threads=1, tensorboard=False, tracking="none"),
                           dir=str(tmp_path / "study"), mode="inprocess")
    [trial] = result.trials
    assert trial["state"] == state, trial
    if state == "COMPLETE":
        assert trial["epochs"] == 2 and trial["value"] == result.best_value > 0.5, trial   # every epoch reported
    assert said in (trial.get("error", "") if state == "FAIL" else capsys.readouterr().out)
