"""A team's MLflow server, for real: `mlflow server` on loopback (sqlite backend) started here and killed by
PID. A run is logged over HTTP by MLFLOW_TRACKING_URI alone (auto picks mlflow); a server killed mid-run
costs one warning, and the run finishes with its files whole. (Issue 27.)

The tests that do not kill the server share one (support.mlflow_server), each in an experiment of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.mlflow_server import shared_mlflow_server, started_mlflow_server  # noqa: F401 - the fixture
from support.paths import PLUGINS_DIR, ROOT
from support.processes import kill_tree, show
from support.runs import EQUIV, records

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

WARNING = "hvdtrain: warning: tracking:"


@pytest.fixture
def own_mlflow_server(tmp_path):
    """A server of this test alone, for a test that kills it."""
    with started_mlflow_server(tmp_path) as server:
        yield server


def train(run_dir: Path, name: str, extra: list[str], url: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a one-process run that finds its tracker by MLFLOW_TRACKING_URI."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=url, PYTHONPATH=str(PLUGINS_DIR), PYTHONUNBUFFERED="1")
    return [sys.executable, "-m", "hvdtrain", *EQUIV, "--max-steps", "0", "--tensorboard", "false",
            "--run-dir", str(run_dir), "--name", name, *extra], env


def test_a_run_is_logged_over_http_when_mlflow_tracking_uri_names_a_server(
        tmp_path, shared_mlflow_server):  # noqa: F811
    url, _ = shared_mlflow_server
    # An experiment of its own on the shared server: the one run in it is this test's.
    command, env = train(tmp_path / "runs", "over-http", ["--epochs", "1", "--tracking-experiment", "over-http"], url)
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)
    client = MlflowClient(url)
    runs = client.search_runs([client.get_experiment_by_name("over-http").experiment_id])
    assert [r.info.run_name for r in runs] == ["over-http"]
    run_id = runs[0].info.run_id
    assert runs[0].data.params["tracking"] == "mlflow"  # auto, resolved by the variable
    written = records(tmp_path / "runs" / "over-http")
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")) == sorted(
        (r["step"], r["loss"]) for r in written if r["kind"] == "train")
    assert {"config.yaml", "summary.json", "model.safetensors"} <= {a.path for a in client.list_artifacts(run_id)}
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # the server's store, not the embedded one


def test_a_server_killed_mid_run_is_one_warning_and_the_run_finishes_whole(tmp_path, own_mlflow_server):
    url, server = own_mlflow_server
    run_dir = tmp_path / "runs" / "server-dies"
    command, env = train(tmp_path / "runs", "server-dies",
                         ["--model", "faults:slow_mlp", "--epochs", "8", "--log-interval", "2"], url)
    # Training holds after step 4 until the server is dead (however long a loaded machine takes to get the
    # first metrics to it), then runs its remaining ~10 s of steps against the dead server.
    hold = tmp_path / "hold"
    hold.touch()
    env.update(FAULTS_SLEEP_S="0.04", FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER="4")
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            client = MlflowClient(url)
            deadline = time.monotonic() + 120
            while not ((run_dir / "tracking.json").exists() and client.get_metric_history(
                    json.loads((run_dir / "tracking.json").read_text())["run_id"], "train/loss")):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            kill_tree(server, 9)
            killed_at = time.time()
            hold.unlink()
            assert proc.wait(timeout=180) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                kill_tree(proc, 9)
    output = log.read_text()
    assert output.count(WARNING) == 1, output
    assert max(r["time"] for r in records(run_dir, "train")) > killed_at, "the server died after training"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs_run"] == 8 and records(run_dir)[-1]["kind"] == "summary"
    assert (run_dir / "model.safetensors").stat().st_size > 0 and (run_dir / "curves.png").exists()


def test_a_rollback_logs_its_new_branch_to_a_new_run_linked_to_the_old_one(
        tmp_path, shared_mlflow_server):  # noqa: F811
    """Issue 36: resumed from step 16 of 48 with another LR, every value up to step 48 was dropped as 'already
    logged', so MLflow showed the abandoned branch's numbers for the new run."""
    url, _ = shared_mlflow_server   # read by run ids alone: other tests' runs on the server do not matter
    run_dir = tmp_path / "runs" / "rollback"
    command, env = train(tmp_path / "runs", "rollback", ["--epochs", "3", "--tracking-experiment", "rollback"], url)
    first = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, show(first)
    old = json.loads((run_dir / "tracking.json").read_text())["run_id"]
    client = MlflowClient(url)
    before = sorted((m.step, m.value) for m in client.get_metric_history(old, "train/loss"))
    assert [s for s, _ in before] == list(range(4, 49, 4))
    second = subprocess.run([*command, "--resume", str(run_dir / "checkpoints" / "ckpt-000000016.pt"),
                             "--lr", "0.01"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "warning" not in second.stdout + second.stderr, show(second)
    new = json.loads((run_dir / "tracking.json").read_text())["run_id"]
    assert new != old and f"below the steps run {old} logged: a new branch" in second.stdout, show(second)
    branch = client.get_run(new)
    assert branch.data.tags["hvdtrain.branch"] == f"{old}@16" and branch.data.tags["mlflow.parentRunId"] == old
    assert branch.info.status == "FINISHED" and client.get_run(old).info.status == "FINISHED"
    # The new branch's own values from the branch point on; the old run keeps the abandoned ones, untouched.
    redone = {r["step"]: r["loss"] for r in records(run_dir, "train")}   # the last record of each step
    logged = sorted((m.step, m.value) for m in client.get_metric_history(new, "train/loss"))
    assert logged == sorted((s, pytest.approx(v)) for s, v in redone.items() if s > 16), logged
    assert sorted((m.step, m.value) for m in client.get_metric_history(old, "train/loss")) == before
    assert logged[-1][1] != dict(before)[48]          # another LR: other numbers, both kept
    assert sorted(m.step for m in client.get_metric_history(new, "epoch/val_acc")) == [32, 48]
