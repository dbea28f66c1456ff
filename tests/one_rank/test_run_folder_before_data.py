"""A run refused its folder is refused before it loads any data (a dataset may take minutes to load)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import PLUGINS, ROOT

from hvdtrain.output.claim import claim

JOB = ["--dataset", "load_probe:marked_synthetic", "--synthetic-samples", "64", "--synthetic-shape", "1,4,4",
       "--model", "mlp", "--hidden", "8", "--threads", "1", "--progress-bar", "off", "--epochs", "1"]


def train(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOAD_PROBE_FILE=str(tmp_path / "loaded"),
               **PLUGINS)
    return subprocess.run([sys.executable, "-m", "hvdtrain", *JOB, "--run-dir", str(tmp_path / "runs"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("holder", ["live", "finished"])
def test_a_second_run_with_the_same_name_is_refused_before_its_data_loads(tmp_path, holder):
    folder = tmp_path / "runs" / "same"
    if holder == "live":    # another run holds the folder: the same flock a training run takes
        held = claim(folder, fresh=True)
    else:                   # a run that finished there
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text("{}\n")
        held = None
    try:
        second = train(tmp_path, "--name", "same")
    finally:
        if held is not None:
            held.release()
    assert second.returncode == 2, second.stdout + second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    why = "is in use by another run" if holder == "live" else "already holds a run"
    assert why in second.stderr and "--name" in second.stderr, second.stderr
    assert not (tmp_path / "loaded").exists(), "the refused run loaded its data first"


def test_a_run_given_its_folder_loads_its_data_once(tmp_path):
    run = train(tmp_path, "--name", "mine")
    assert run.returncode == 0, run.stdout + run.stderr
    assert len((tmp_path / "loaded").read_text().splitlines()) == 1
    assert (tmp_path / "runs" / "mine" / "summary.json").exists()
    assert not (tmp_path / "runs" / "mine" / ".hvdtrain.lock").exists()


def test_a_run_whose_data_fails_to_load_leaves_no_folder(tmp_path):
    run = train(tmp_path, "--name", "mine", "--dataset", "load_probe:no_such_builder")
    assert run.returncode == 2 and "has no function 'no_such_builder'" in run.stderr, run.stderr
    assert not (tmp_path / "runs").exists()
