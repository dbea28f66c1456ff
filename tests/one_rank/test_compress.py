"""`hvdtrain compress` in one process: int8, structured pruning, the report, export, predict, bad input.

Teachers are trained here (digits, a few epochs, one thread); every number asserted is measured in the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.paths import PLUGINS, ROOT
from support.processes import show
from torch import nn

import hvdtrain
from hvdtrain.compression.comparison_report import table as report_table
from hvdtrain.compression.distill import DistillLoss
from hvdtrain.compression.export import load_exported
from hvdtrain.compression.measure import count_params
from hvdtrain.compression.prune import prune_channels
from hvdtrain.compression.quantize import quantize_int8
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.trained import finished_run

FAST = {"repeats": 10, "verbose": False}  # 10 timed passes per model and batch size keep the tests short


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two finished runs on digits: mlp (8 epochs) and cnn (5 epochs), one worker, one thread."""
    root = tmp_path_factory.mktemp("compress")
    for model, epochs in (("mlp", 8), ("cnn", 5)):
        hvdtrain.fit(hvdtrain.load_config(model=model, epochs=epochs, threads=1, run_dir=str(root), name=model,
                                          tensorboard=False))
    return root


def val_inputs(source) -> torch.Tensor:
    return torch.stack([source.data.val[i][0] for i in range(len(source.data.val))])


def check_report(report: dict, out: Path, source) -> None:
    """The report's numbers are this run's measurements: file sizes, parameter counts, latency settings."""
    original, compressed = report["models"][0], report["models"][1]
    assert original["bytes"] == (source.path / "model.pt").stat().st_size
    assert compressed["bytes"] == (out / "compressed.pt").stat().st_size
    assert original["params"] == sum(p.numel() for p in source.model.parameters())
    assert report["latency"]["threads"] == 1 and report["latency"]["batch_sizes"] == [1, 64]
    assert report["latency"]["repeats"] == 10 and report["latency"]["statistic"] == "median"
    for row in report["models"]:
        assert set(row["latency_ms"]) == {"1", "64"} and all(v > 0 for v in row["latency_ms"].values())
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "report.png").read_bytes().startswith(b"\x89PNG")
    text = (out / "report.txt").read_text()
    assert "1 torch thread(s), batch sizes 1, 64" in text and "ms@batch64" in text
    assert report["export"]["ok"] and report["export"]["max_abs_diff"] <= 1e-5


def test_int8_mlp_is_2x_smaller_as_accurate_and_its_export_matches(runs, tmp_path):
    source = finished_run.read(runs / "mlp")
    out = tmp_path / "mlp-int8"
    report = hvdtrain.compress(runs / "mlp", "int8", out=str(out), **FAST)
    check_report(report, out, source)
    original, int8 = report["models"]
    print(f"\nint8 mlp: bytes {original['bytes']} -> {int8['bytes']}, acc {original['val_acc']:.4f} -> "
          f"{int8['val_acc']:.4f}, ms@1 {original['latency_ms']['1']:.3f} -> {int8['latency_ms']['1']:.3f}, ms@64 "
          f"{original['latency_ms']['64']:.3f} -> {int8['latency_ms']['64']:.3f}")
    assert report["details"]["int8_mode"] == "dynamic" and report["details"]["int8_layers"] == ["1", "3", "5"]
    assert original["bytes"] >= 2 * int8["bytes"]
    assert abs(int8["val_acc"] - original["val_acc"]) <= 0.01

    # The export loads in a fresh interpreter without hvdtrain, and matches the in-process int8 model.
    inputs = val_inputs(source)
    torch.save(inputs, tmp_path / "inputs.pt")
    script = ("import sys, torch\n"
              f"model = torch.export.load({str(out / 'model.pt2')!r}).module()\n"
              f"torch.save(model(torch.load({str(tmp_path / 'inputs.pt')!r})), {str(tmp_path / 'exported.pt')!r})\n"
              "assert not any(name.startswith('hvdtrain') for name in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, show(proc)
    in_process = quantize_int8(source.model, "dynamic", inputs).model
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "exported.pt"), in_process(inputs), atol=1e-5, rtol=0)
        exported_acc = (load_exported(out / "model.pt2")(inputs).argmax(1) == source.data.val.tensors[1]).float()
    assert exported_acc.mean().item() == pytest.approx(int8["val_acc"])


def test_cnn_static_int8_and_pruning_side_by_side_and_predict_takes_them(runs, tmp_path):
    source = finished_run.read(runs / "cnn")
    out = tmp_path / "cnn"
    report = hvdtrain.compress(runs / "cnn", "int8,prune", out=str(out), calibration=128, sparsity=0.5, **FAST)
    assert [row["name"] for row in report["models"]] == ["original", "int8 (static)", "pruned 50%"]
    assert json.loads((out / "report.json").read_text()) == report and report["export_ok"]
    assert (out / "report.png").read_bytes().startswith(b"\x89PNG")
    assert "int8 (static)" in (out / "report.txt").read_text()
    reports = {method: json.loads((out / method / "report.json").read_text()) for method in ("int8", "prune")}
    for method, single in reports.items():
        check_report(single, out / method, source)
        assert single["models"][1] == report["models"][1 if method == "int8" else 2]  # measured once, together

    original, int8 = reports["int8"]["models"]
    print(f"\nstatic int8 cnn: bytes {original['bytes']} -> {int8['bytes']}, acc {original['val_acc']:.4f} -> "
          f"{int8['val_acc']:.4f}, ms@1 {original['latency_ms']['1']:.3f} -> {int8['latency_ms']['1']:.3f}, ms@64 "
          f"{original['latency_ms']['64']:.3f} -> {int8['latency_ms']['64']:.3f}")
    assert reports["int8"]["details"]["int8_mode"] == "static"
    assert reports["int8"]["details"]["calibration_samples"] == 128
    assert original["bytes"] >= 3 * int8["bytes"]  # int8 weights, float32 biases and scales
    assert abs(int8["val_acc"] - original["val_acc"]) <= 0.01

    pruned = reports["prune"]["models"][1]
    details = reports["prune"]["details"]
    print(f"prune cnn 50%: params {original['params']} -> {pruned['params']}, bytes {original['bytes']} -> "
          f"{pruned['bytes']}, acc {original['val_acc']:.4f} -> {pruned['val_acc']:.4f} (before fine-tune "
          f"{details['val_acc_before_finetune']:.4f}), ms@1 {original['latency_ms']['1']:.3f} -> "
          f"{pruned['latency_ms']['1']:.3f}, ms@64 {original['latency_ms']['64']:.3f} -> "
          f"{pruned['latency_ms']['64']:.3f}")
    assert details["pruned_layers"] == ["0: Conv2d 32 -> 16 channels", "2: Conv2d 64 -> 32 channels",
                                        "7: Linear 128 -> 64 neurons"]
    assert pruned["params"] <= 0.6 * original["params"] and pruned["bytes"] <= 0.6 * original["bytes"]
    assert pruned["val_acc"] >= original["val_acc"] - 0.02
    assert details["finetune"]["epochs"] == 3

    # `hvdtrain predict` takes a compressed run directory; its outputs are the exported model's.
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "predict", "--checkpoint", str(out / "int8"),
                           "--out", str(tmp_path / "pred.pt")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    inputs = val_inputs(source)
    expected = load_exported(out / "int8" / "model.pt2")(inputs).detach()
    torch.testing.assert_close(torch.load(tmp_path / "pred.pt"), expected, atol=1e-6, rtol=0)
    # Trainer.predict / evaluate take a compressed model too (an nn.Module whose eval() is a no-op).
    trainer = hvdtrain.Trainer(load_exported(out / "prune" / "model.pt2"), source.data.train, source.data.val,
                               config=hvdtrain.load_config(run_dir="", threads=1))
    with torch.no_grad():
        torch.testing.assert_close(trainer.predict(source.data.val),
                                   load_exported(out / "prune" / "model.pt2")(inputs), atol=1e-6, rtol=0)
    assert trainer.evaluate()["val_acc"] == pytest.approx(pruned["val_acc"])


def test_the_table_shows_compiled_latency_when_measured():
    row = {"name": "original", "params": 10, "bytes": 100, "export_bytes": 200, "latency_ms": {"1": 0.5},
           "compiled_latency_ms": {"1": 0.25}, "compile_s": 3.0, "val_acc": 0.9}
    text = report_table({"models": [row, {**row, "name": "int8", "compiled_latency_ms": None}],
                         "latency": {"batch_sizes": [1], "repeats": 5, "threads": 1, "mode": "eager",
                                     "compiled": "torch.compile"}, "notes": ["a note"]})
    lines = text.splitlines()
    assert lines[0].split() == ["model", "params", "bytes", "pt2_bytes", "ms@batch1", "compiled_ms@batch1", "val_acc"]
    assert lines[1].split() == ["original", "10", "100", "200", "0.500", "0.250", "0.9000"]
    assert lines[2].split()[-2] == "-"
    assert "5 forward passes, 1 torch thread(s), batch sizes 1, eager; compiled: torch.compile" in lines[3]
    assert lines[4] == "note: a note"


def test_pruning_removes_exactly_the_dead_channels():
    """Channels whose weights are zero carry nothing: removing them leaves the outputs unchanged."""
    config = hvdtrain.load_config(model="cnn")
    torch.manual_seed(0)
    model = build_model(config, (1, 8, 8), 10).eval()
    with torch.no_grad():
        for index in (0, 2, 7):
            model[index].weight[1::2] = 0  # every other channel/neuron dead
            model[index].bias[1::2] = 0
    pruned, _ = prune_channels(model, 0.5)
    inputs = torch.rand(16, 1, 8, 8)
    torch.testing.assert_close(pruned(inputs), model(inputs), atol=1e-5, rtol=0)
    assert [pruned[i].weight.shape[0] for i in (0, 2, 7)] == [16, 32, 64]
    assert count_params(pruned) < count_params(model) / 3


def test_prune_refuses_a_model_it_cannot_shrink():
    with pytest.raises(UserError, match="nn.Sequential"):
        prune_channels(nn.Linear(4, 2), 0.5)
    with pytest.raises(UserError, match="layer 1 .*LSTM"):
        prune_channels(nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4), nn.Linear(4, 2)), 0.5)


def test_static_int8_falls_back_and_says_why():
    class Branchy(nn.Module):  # data-dependent control flow: torch.export cannot trace it
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 4, 3), nn.Linear(4 * 6 * 6, 10)

        def forward(self, x):
            y = self.conv(x).flatten(1)
            return self.fc(y) if y.sum() > 0 else -self.fc(y)

    result = quantize_int8(Branchy(), "auto", torch.rand(16, 1, 8, 8))
    assert result.mode == "dynamic" and result.int8_layers == ["fc"]
    assert result.notes[0].startswith("static PT2E int8 failed") and "fell back to dynamic" in result.notes[0]
    assert any("Conv2d layers conv stay float32" in note for note in result.notes)


def test_distill_loss_is_cross_entropy_for_labels_and_blends_soft_targets():
    torch.manual_seed(0)
    student, teacher, labels = torch.randn(8, 10), torch.randn(8, 10), torch.randint(0, 10, (8,))
    ce = nn.functional.cross_entropy(student, labels)
    soft = torch.cat([labels.float()[:, None], teacher], dim=1)
    torch.testing.assert_close(DistillLoss(4.0, 0.5)(student, labels), ce)
    torch.testing.assert_close(DistillLoss(4.0, 0.0)(student, soft), ce)
    same = torch.cat([labels.float()[:, None], student], dim=1)  # a student equal to its teacher: no soft loss
    torch.testing.assert_close(DistillLoss(2.0, 1.0)(student, same), torch.tensor(0.0), atol=1e-6, rtol=0)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", "compress", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **PLUGINS))


@pytest.mark.parametrize("case", ["no model", "unknown method", "student does not fit", "output exists"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(runs, tmp_path, case):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    args, message = {
        "no model": ([str(empty), "--method", "int8", "--out", str(tmp_path / "new")],
                     f"{empty} has no model.pt"),
        "unknown method": ([str(runs / "mlp"), "--method", "int4", "--out", str(tmp_path / "new")],
                           "unknown method 'int4'; choose one of int8, prune, distill"),
        "student does not fit": ([str(runs / "mlp"), "--method", "distill", "--student", "students:five_classes",
                                  "--out", str(tmp_path / "new")],
                                 "student students:five_classes does not fit the data: it returns (1, 5) for one "
                                 "sample, expected (1, 10)"),
        "output exists": ([str(runs / "mlp"), "--method", "int8", "--out", str(tmp_path / "taken")],
                          "already exists and is not empty"),
    }[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    source_files = sorted(p.name for p in (runs / "mlp").iterdir())
    proc = run_cli(*args)
    assert proc.returncode == 2, show(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: ") and message in lines[0], show(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in (runs / "mlp").iterdir()) == source_files


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """A finished run that only has to exist: mlp on digits, one epoch."""
    root = tmp_path_factory.mktemp("quick")
    hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=1, threads=1, run_dir=str(root), name="mlp",
                                      tensorboard=False))
    return root / "mlp"


def _raise(err: BaseException):
    def fail(*args, **kwargs):
        raise err
    return fail


@pytest.mark.parametrize("case, owner, name, expected", [
    ("unreadable weights", torch, "load", "model.pt is not a readable hvdtrain checkpoint (ValueError)"),
    ("weights that do not fit", nn.Module, "load_state_dict", "does not fit the model of"),
    ("an export that fails", torch.export, "export", "could not be exported with torch.export: RuntimeError"),
])
def test_a_library_error_without_a_message_is_still_one_line(quick_run, tmp_path, monkeypatch, case, owner, name,
                                                               expected):
    monkeypatch.setattr(owner, name, _raise(ValueError() if case == "unreadable weights" else RuntimeError()))
    with pytest.raises(UserError) as raised:
        hvdtrain.compress(quick_run, "int8", out=str(tmp_path / "out"), **FAST)
    text = str(raised.value)
    assert expected in text and "\n" not in text and not text.endswith(": "), text
