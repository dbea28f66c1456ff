"""Bad input through the real command line: one line, exit 2, nothing written."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support.paths import ROOT
from support.processes import horovodrun, show


def hvdtrain(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


def assert_user_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hvdtrain: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--epochz", "3"], "unknown config key 'epochz' (did you mean 'epochs'?)"),
    (["--epochs", "three"], "epochs must be an integer, got 'three'"),
    (["--batch-size", "0"], "batch_size must be > 0"),
    (["--model", "resnet"], "unknown model 'resnet'; choose one of mlp, cnn"),
    (["--dataset", "mnist"], "unknown dataset 'mnist'; choose one of digits, synthetic"),
    (["--model", "not_a_pkg.models:build"], "cannot import module 'not_a_pkg.models'"),
    (["--config", "missing.yaml"], "config file missing.yaml does not exist"),
    (["--config", "bad.yaml"], "config file bad.yaml line 3: YAML syntax error"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "bad.yaml").write_text("epochs: 2\nlr: [0.1\n")
    before = set(tmp_path.iterdir())
    proc = hvdtrain("train", *args, "--run-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_user_error(proc, message)
    assert set(tmp_path.iterdir()) == before


def test_dataset_smaller_than_the_world_fails_on_every_rank_without_output(tmp_path):
    proc = horovodrun(2, ["-m", "hvdtrain", "--dataset", "synthetic", "--synthetic-samples", "2",
                          "--val-fraction", "0.5", "--run-dir", str(tmp_path / "runs")], "gloo",
                      cwd=tmp_path, timeout=180)
    assert proc.returncode != 0, show(proc)
    assert "hvdtrain: error: the training set has 1 samples, fewer than the 2 workers" in proc.stderr + proc.stdout
    # horovodrun itself prints a traceback when a worker fails; the workers (lines tagged [rank]) must not.
    worker_lines = [line for line in (proc.stdout + proc.stderr).splitlines() if re.match(r"\[\d+\]<", line)]
    assert worker_lines and not any("Traceback" in line for line in worker_lines), show(proc)
    assert not (tmp_path / "runs").exists()


def test_help_lists_every_config_key():
    from hvdtrain.config.train_config import FIELD_TYPES

    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0
    for key in FIELD_TYPES:
        assert f"--{key.replace('_', '-')} " in proc.stdout, key
