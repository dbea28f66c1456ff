"""`--tracking wandb` without a network: an offline W&B run inside the run folder, for a later `wandb sync`.

Real wandb 0.31 (its own service process writes the run file); the file is read back with wandb's own protobuf
records (hvdtrain.tracking.wandb_files: wandb has no Python reader of its own). (Issue 27.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.paths import ROOT
from support.processes import show
from support.runs import EQUIV, records

pytest.importorskip("wandb")
from hvdtrain.tracking import wandb_files  # noqa: E402

TRAIN = [*EQUIV, "--max-steps", "0", "--epochs", "3", "--tensorboard", "false", "--tracking", "wandb"]


def run(args, tmp_path):
    # wandb's own caches and settings in the test's folder, not the home directory; no key, no mode: offline.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_CACHE_DIR=str(tmp_path / "cache"), WANDB_CONFIG_DIR=str(tmp_path / "config"),
               WANDB_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", *TRAIN, "--run-dir", str(tmp_path / "runs"),
                           "--name", "wb", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    # No warning of ours (a library's own, e.g. urllib3's DependencyWarning about PySocks, is not this test's).
    assert proc.returncode == 0 and "hvdtrain: warning" not in proc.stdout + proc.stderr, show(proc)
    assert "tracking:" not in proc.stderr, show(proc)
    return proc


def test_an_offline_run_holds_the_config_every_step_and_the_summary_and_a_resume_continues_it(tmp_path):
    first = run([], tmp_path)
    folder = tmp_path / "runs" / "wb"
    saved = json.loads((folder / "tracking.json").read_text())
    assert saved["tracker"] == "wandb" and saved["mode"] == "offline"
    assert f"W&B run {saved['run_id']} (offline" in first.stdout, show(first)
    [offline] = [p for p in (folder / "wandb").glob("offline-run-*") if not p.is_symlink()]  # for `wandb sync`
    logged = list(wandb_files.records(offline / f"run-{saved['run_id']}.wandb"))
    kinds = [r.WhichOneof("record_type") for r in logged]
    [started] = [r.run for r in logged if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in started.config.update}
    assert started.display_name == "wb" and started.project == "hvdtrain"
    assert config["lr"] == "0.05" and config["tracking"] == "wandb" and config["hvdtrain"]["workers"] == "1"
    summary = {}
    for r in logged:
        if r.WhichOneof("record_type") == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in r.summary.update if item.key})
    written = json.loads((folder / "summary.json").read_text())
    assert summary["val_acc"] == pytest.approx(written["val_acc"]) and summary["steps"] == written["steps"] == 48
    assert kinds[-1] == "exit" and logged[-1].exit.exit_code == 0 and "artifact" in kinds
    rows = wandb_files.history(folder / "wandb")
    assert [(row["_step"], row["train/loss"]) for row in rows if "train/loss" in row] == [
        (r["step"], pytest.approx(r["loss"])) for r in records(folder, "train")]
    assert [row["epoch/val_acc"] for row in rows if "epoch/val_acc" in row] == [
        pytest.approx(r["val_acc"]) for r in records(folder, "epoch")]

    # A crash-resume from the newest checkpoint (48) to 4 epochs: the same run goes on, each step once.
    second = run(["--resume", "auto", "--epochs", "4"], tmp_path)
    assert f"continuing W&B run {saved['run_id']}" in second.stdout, show(second)
    assert _steps(folder, saved["run_id"]) == list(range(4, 65, 4))   # in order, across both processes' files

    # A rollback to step 32 (issue 36): steps 36-64 of the new branch differ from those the run holds, so they
    # go to a new run tagged with where it branched, not dropped; the old run keeps its values.
    third = run(["--resume", str(folder / "checkpoints" / "ckpt-000000032.pt"), "--epochs", "4", "--lr", "0.01"],
                tmp_path)
    branch = json.loads((folder / "tracking.json").read_text())["run_id"]
    assert branch != saved["run_id"] and "a new branch" in third.stdout, show(third)
    assert _steps(folder, branch) == list(range(36, 65, 4))
    assert _steps(folder, saved["run_id"]) == list(range(4, 65, 4))
    [path] = [p for p in (folder / "wandb").glob(f"offline-run-*-{branch}/run-{branch}.wandb")]
    [started] = [r.run for r in wandb_files.records(path) if r.WhichOneof("record_type") == "run"]
    tags = {item.key: json.loads(item.value_json) for item in started.config.update}["hvdtrain"]
    assert tags["hvdtrain.branch"] == f"{saved['run_id']}@32"


def _steps(folder, run_id):
    """The train/loss steps of one W&B run's offline files, in the order written."""
    steps = []
    for path in sorted(folder.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
        for record in wandb_files.records(path):
            if record.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                if "train/loss" in row:
                    steps.append(row["_step"])
    return steps


def test_the_reader_follows_records_across_the_files_32_kib_blocks(tmp_path, monkeypatch):
    import wandb

    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    big = "x" * 100_000   # one record over three blocks: FIRST, MIDDLE, LAST chunks
    run = wandb.init(project="p", dir=str(tmp_path), mode="offline", config={"big": big},
                     settings=wandb.Settings(silent=True, console="off"))
    for step in range(0, 300, 3):
        run.log({"m/a": float(step)}, step=step)
    run.finish()
    # finish() can return before wandb's service has written the file's last blocks (CI once read exactly
    # 3 x 32 KiB of ~124 KiB); teardown waits for the service process to exit, which closes the file.
    wandb.teardown()
    [path] = [p for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb") if not p.parent.is_symlink()]
    assert path.stat().st_size > 3 * wandb_files.BLOCK
    [started] = [r.run for r in wandb_files.records(path) if r.WhichOneof("record_type") == "run"]
    assert {item.key: json.loads(item.value_json) for item in started.config.update}["big"] == big
    assert [row["m/a"] for row in wandb_files.history(tmp_path / "wandb")] == [float(s) for s in range(0, 300, 3)]
    assert wandb_files.last_steps(tmp_path / "wandb", run.id) == {"m/a": 297}


def test_an_offline_run_writes_no_credential_anywhere_in_its_folder(tmp_path, monkeypatch):
    """Issue 36: credentials in the environment (by name and by value shape) reach neither W&B's files nor any
    other file of the run folder, nor the console."""
    secrets = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx", "MY_DB": "postgresql://alice:pw-s3cret-42@db:5432/x",
               "HTTPS_PROXY": "http://bob:proxy-s3cret-7@127.0.0.1:9"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    proc = run([], tmp_path)
    needles = ["abcdefghijklmnopqrstuvwx", "pw-s3cret-42", "proxy-s3cret-7"]
    assert not [n for n in needles if n in proc.stdout + proc.stderr]
    files = [path for path in (tmp_path / "runs").rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files), "no W&B run file was written"
    leaked = [(str(path.relative_to(tmp_path)), n) for path in files for n in needles
              if n.encode() in path.read_bytes()]
    assert not leaked, leaked
