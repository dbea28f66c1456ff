"""`hvdtrain compress` on 2 workers (real horovodrun -np 2 --gloo): distillation and pruning's fine-tune."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, horovodrun, show

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
    assert pruned["val_acc"] >= original["val_acc"] - 0.02
