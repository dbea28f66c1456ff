"""`hvdtrain compress` on 2 workers (real horovodrun -np 2 --gloo): distillation and pruning's fine-tune."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import PLUGINS, ROOT
from support.processes import horovodrun, show

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """The teacher: the built-in cnn (151k parameters) on digits, 5 epochs, one worker, one thread."""
    root = tmp_path_factory.mktemp("teacher")
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "--model", "cnn", "--epochs", "5", "--threads", "1",
                           "--tensorboard", "false", "--run-dir", str(root), "--name", "cnn"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    return root / "cnn"


def test_distilled_student_on_two_workers_beats_the_same_student_alone(teacher, tmp_path):
    out = tmp_path / "student"
    proc = horovodrun(2, ["-m", "hvdtrain", "compress", str(teacher), "--method", "distill", "--student", "mlp",
                          "--student-hidden", "64", "--epochs", "5", "--temperature", "4", "--alpha", "0.5",
                          "--repeats", "10", "--out", str(out)], "gloo")
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.count("hvdtrain compress: wrote") == 1, show(proc)  # rank 0 reports, once
    report = json.loads((out / "report.json").read_text())
    original, distilled, alone = report["models"]
    details = report["details"]
    print(f"\ndistill on {details['workers']} workers: teacher {original['params']} params acc "
          f"{original['val_acc']:.4f}; student {distilled['params']} params: with teacher {distilled['val_acc']:.4f}, "
          f"without {alone['val_acc']:.4f} ({details['epochs']} epochs each); bytes {original['bytes']} -> "
          f"{distilled['bytes']}; ms@1 {original['latency_ms']['1']:.3f} -> {distilled['latency_ms']['1']:.3f}; "
          f"ms@64 {original['latency_ms']['64']:.3f} -> {distilled['latency_ms']['64']:.3f}")
    assert details["workers"] == 2 and details["epochs"] == 5
    assert (alone["name"], alone["params"]) == ("student (no teacher)", distilled["params"])
    assert distilled["params"] * 4 <= original["params"]
    # Thresholds: a student differs from its teacher by design; its accuracy is what distillation promises.
    assert distilled["val_acc"] >= 0.93
    assert distilled["val_acc"] > alone["val_acc"]
    assert details["distilled_val_acc"][-1] == pytest.approx(distilled["val_acc"])  # Trainer's view == measured
    assert report["export"]["ok"] and (out / "config.yaml").read_text().startswith("model: mlp")


def test_prune_fine_tunes_on_two_workers_started_by_np(teacher, tmp_path):
    out = tmp_path / "pruned"
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "compress", str(teacher), "--method", "prune",
                           "--np", "2", "--sparsity", "0.5", "--repeats", "10", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    report = json.loads((out / "report.json").read_text())
    original, pruned = report["models"]
    print(f"\nprune on 2 workers: params {original['params']} -> {pruned['params']}, bytes {original['bytes']} -> "
          f"{pruned['bytes']}, acc {original['val_acc']:.4f} -> {pruned['val_acc']:.4f}, ms@1 "
          f"{original['latency_ms']['1']:.3f} -> {pruned['latency_ms']['1']:.3f}, ms@64 "
          f"{original['latency_ms']['64']:.3f} -> {pruned['latency_ms']['64']:.3f}")
    assert report["details"]["finetune"]["workers"] == 2
    assert pruned["params"] <= 0.6 * original["params"] and pruned["bytes"] <= 0.6 * original["bytes"]
    # A threshold: pruning changes the model by design; keeping its accuracy is what compress promises.
    assert pruned["val_acc"] >= original["val_acc"] - 0.02


def test_int8_on_two_mpi_ranks_started_by_np_writes_from_rank_0_only(teacher, tmp_path):
    """horovodrun --mpi sets Open MPI's rank variables, not HOROVOD_RANK: still only rank 0 writes OUT.

    The teacher's run, its dataset renamed to the writer_probe plug-in (the same digits), makes every
    rank record each file it opens for writing, each folder it makes and each rename under OUT.
    """
    source, out, marks = tmp_path / "cnn", tmp_path / "cnn-int8", tmp_path / "marks"
    source.mkdir()
    marks.mkdir()
    shutil.copy(teacher / "model.pt", source / "model.pt")
    config = (teacher / "config.yaml").read_text()
    assert "\ndataset: digits\n" in config
    (source / "config.yaml").write_text(config.replace("\ndataset: digits\n", "\ndataset: writer_probe:digits\n"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", WRITER_PROBE_OUT=str(out), WRITER_PROBE_MARKS=str(marks),
               **PLUGINS)
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "compress", str(source), "--method", "int8", "--np", "2",
                           "--mpi", "--calibration", "32", "--repeats", "3", "--batch-sizes", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    writers = {mark.name: mark.read_text() for mark in marks.iterdir()}
    assert proc.returncode == 0, f"writers: {writers}\n{show(proc)}"
    assert sorted(writers) == ["rank-0.txt"], f"writers: {writers}\n{show(proc)}"
    assert "report.json" in writers["rank-0.txt"] and "compressed.pt" in writers["rank-0.txt"]
    assert proc.stdout.count("hvdtrain compress: wrote") == 1, show(proc)
    assert json.loads((out / "report.json").read_text())["export_ok"]
