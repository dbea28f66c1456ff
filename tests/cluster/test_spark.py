"""Spark: hvdtrain.spark.fit and `hvdtrain spark` on a real local[2] Spark, 2 Horovod workers (Gloo).

pyspark is a default extra of `make setup`, so it is imported, not skipped: only a missing Java skips.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyspark  # noqa: F401 - a missing pyspark is a setup bug (EXTRAS in the Makefile), not a skip
import pytest
from support.paths import ROOT
from support.processes import horovodrun, show
from support.runs import DefaultJob
from support.spark_session import SPARK_ENV, local_session, needs_java
from support.worker_fns import _raise_on_rank_1

import hvdtrain
import hvdtrain.spark.spark_fit
from hvdtrain.errors import LaunchError, WorkerError


@pytest.fixture(scope="module")
def spark():
    session = local_session("hvdtrain-tests")
    yield session
    session.stop()


# The default job (digits, its CNN, seed, LR schedule) cut to 2 epochs for the Spark and Ray equality tests: that a
# launcher runs the very same trainer shows in equal weights after any number of epochs, and 10 epochs three times
# over (horovodrun, Spark, Ray) were ~24 CPU-s of training each. Its accuracy is test_trainer_multirank's to prove.
SHORT_EPOCHS = 2
_SHORT_DEFAULT_JOB: list[DefaultJob] = []


def short_default_job_run(tmp_path_factory: pytest.TempPathFactory) -> DefaultJob:
    """The default job of SHORT_EPOCHS under `horovodrun -np 2 --gloo`, one thread a worker: trained once per session
    for this module and test_ray.py (which imports it), kept here since a fixture of one module is not another's."""
    if not _SHORT_DEFAULT_JOB:
        run_dir = tmp_path_factory.mktemp("short-default-job")
        proc = horovodrun(2, ["-m", "hvdtrain", "--threads", "1", "--epochs", str(SHORT_EPOCHS), "--run-dir",
                              str(run_dir), "--name", "default"], "gloo")
        assert proc.returncode == 0, show(proc)
        _SHORT_DEFAULT_JOB.append(DefaultJob(run_dir / "default", proc.stdout))
    return _SHORT_DEFAULT_JOB[0]


@pytest.fixture
def short_default_job(tmp_path_factory) -> DefaultJob:
    """Tests only read its folder."""
    return short_default_job_run(tmp_path_factory)


@pytest.mark.parametrize("master, task_cpus, slots", [
    ("local", 1, 1), ("local[4]", 1, 4), ("local[4]", 2, 2), ("local[*]", 1, 8), ("local[3, 2]", 1, 3),
    ("local-cluster[2, 3, 1024]", 1, 6), ("spark://head:7077", 1, None), ("yarn", 1, None)])
def test_local_slots(master, task_cpus, slots):
    assert hvdtrain.spark.spark_fit.local_slots(master, task_cpus, cpu_count=8) == slots


def test_spark_config_makes_run_dir_absolute_and_threads_the_task_cpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = hvdtrain.spark.spark_fit._spark_config(hvdtrain.load_config(run_dir="runs"), task_cpus=3)
    assert config.run_dir == str(tmp_path / "runs") and config.threads == 3
    config = hvdtrain.spark.spark_fit._spark_config(hvdtrain.load_config(run_dir="", threads=2), task_cpus=3)
    assert config.run_dir == "" and config.threads == 2


@pytest.mark.parametrize("args, message", [
    (["--num-proc", "0"], "spark: --num-proc must be >= 1, got 0"),
    (["--num-proc"], "spark: argument --num-proc: expected one argument (see `hvdtrain spark --help`)"),
    (["--start-timeout=soon"], "spark: argument --start-timeout: must be an integer, got 'soon' "
                               "(see `hvdtrain spark --help`)"),
    (["--epochz", "3"], "unknown config key 'epochz' (did you mean 'epochs'?)"),
])
def test_spark_cli_bad_arguments_are_one_line_before_spark_starts(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "spark", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == f"hvdtrain: error: {message}", show(proc)


@needs_java
def test_too_few_task_slots_fails_in_one_line_before_any_task_starts(spark):
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"num_proc 3 needs 3 concurrent Spark tasks but master local\[2\]"):
        hvdtrain.spark.fit(hvdtrain.load_config(run_dir=""), num_proc=3, spark=spark)
    assert time.monotonic() - start < 5


@needs_java
def test_a_failing_function_on_one_spark_task_names_its_rank_within_90_s(spark):
    start = time.monotonic()
    with pytest.raises(WorkerError) as err:
        hvdtrain.spark.fit(_raise_on_rank_1, num_proc=2, spark=spark)
    assert time.monotonic() - start < 90  # Spark's task start is most of it
    assert err.value.rank == 1
    assert str(err.value).startswith("rank 1 raised ValueError: planted failure on rank 1")
    assert "_raise_on_rank_1" in err.value.remote_traceback


@needs_java
def test_default_job_of_2_epochs_on_two_spark_tasks_matches_horovodrun(spark, tmp_path, short_default_job):
    """Runs after the failure above: the same session trains fine. Then the same job under horovodrun."""
    history = hvdtrain.spark.fit(hvdtrain.load_config(run_dir=str(tmp_path), name="spark", threads=1,
                                                      epochs=SHORT_EPOCHS), num_proc=2, spark=spark)
    assert len(history) == SHORT_EPOCHS and history.summary["workers"] == 2
    assert history[-1]["val_samples"] == 359  # the whole held-out split, once
    digests = history.summary["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    run = tmp_path / "spark"
    assert history.summary["run_dir"] == str(run)
    assert {"config.yaml", "metrics.jsonl", "summary.json", "model.pt", "curves.png"} <= {
        p.name for p in run.iterdir()}
    assert json.loads((run / "summary.json").read_text())["param_digests"] == digests

    # The same trainer, not a Spark copy of it: horovodrun's workers (the same job, shared with test_ray.py) end with
    # the very same weights.
    launched = short_default_job.last_epoch()
    assert json.loads((short_default_job.run / "summary.json").read_text())["param_digests"] == digests
    # Exact, not an accuracy bar: the default job's target is test_trainer_multirank's to prove.
    assert launched["val_acc"] == history[-1]["val_acc"], (launched, history.table())
    assert launched["val_loss"] == pytest.approx(history[-1]["val_loss"], abs=1e-6)


@needs_java
def test_spark_submit_trains_a_plugin_with_the_entry_file(tmp_path):
    """The cluster form, on a local master: spark-submit runs hvdtrain/cli/entry/spark_submit.py."""
    submit = Path(sys.executable).parent / "spark-submit"
    env = dict(os.environ, **SPARK_ENV, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]))
    proc = subprocess.run([str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                           "--conf", f"spark.pyspark.python={sys.executable}",
                           str(ROOT / "hvdtrain" / "cli" / "entry" / "spark_submit.py"), "--num-proc", "2",
                           "--model", "my_plugins:build_model", "--dataset", "my_plugins:build_dataset",
                           "--epochs", "30", "--lr", "0.1", "--run-dir", str(tmp_path), "--name", "rings"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "hvdtrain: spark run done: 2 worker(s)" in proc.stdout, show(proc)
    summary = json.loads((tmp_path / "rings" / "summary.json").read_text())
    # A threshold: no reference run of the rings plug-in exists; the claim is that spark-submit trains it.
    assert summary["val_acc"] >= 0.95 and len(set(summary["param_digests"])) == 1, summary


@needs_java
def test_cli_starts_a_local_session_and_reports_a_worker_user_error_in_one_line(tmp_path):
    env = dict(os.environ, **SPARK_ENV, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "spark", "--num-proc", "2", "--model",
                           "not_a_pkg.models:build", "--run-dir", str(tmp_path / "runs")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, show(proc)
    assert "hvdtrain: no active SparkSession; started a local one (local[" in proc.stderr, show(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdtrain: error: rank 0: cannot import module 'not_a_pkg.models'"), show(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, show(proc)
    assert not (tmp_path / "runs").exists()
