"""MLFLOW_TRACKING_URI with a password in it, against a real MLflow server: a training run and its compression
write the password nowhere (run folders, MLflow params, tags, artifacts), and every file they write follows the
umask. (Issue 36, item 5; issue 51, item 7: a password with an '@' in it, a Databricks token.)"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.mlflow_server import shared_mlflow_server  # noqa: F401 - the fixture
from support.paths import PLUGINS_DIR, ROOT
from support.processes import show

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

PASSWORD = "s3cret@Pw0rd"   # an '@' in it: masked to the last '@', not the first (issue 51 item 7)
TOKEN = "dapi0123456789abcdef0123456789abcdef"   # MLflow sends it as a Bearer header; the server ignores it
# None of these may be written or shown anywhere: the whole password, each side of its '@', the token.
FRAGMENTS = (PASSWORD, "s3cret", "Pw0rd", TOKEN, "0123456789abcdef0123")
JOB = """
import hvdtrain
hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=1, threads=1, run_dir="runs", name="mlp", tensorboard=False,
                                  max_steps=4, tracking_experiment={experiment!r}))
hvdtrain.compress("runs/mlp", "int8", repeats=1, verbose=False)
"""


def test_a_password_in_the_tracking_uri_is_written_nowhere_and_files_follow_the_umask(
        tmp_path, shared_mlflow_server):  # noqa: F811
    url, _ = shared_mlflow_server   # shared with test_tracking_server's tests: this one's experiments are its own
    secret_url = url.replace("http://", f"http://alice:{PASSWORD}@")
    env = dict(os.environ, MLFLOW_TRACKING_URI=secret_url, MLFLOW_TRACKING_TOKEN=TOKEN,
               PYTHONPATH=f"{ROOT}:{PLUGINS_DIR}", PYTHONUNBUFFERED="1")
    client = MlflowClient(url)
    for umask in (0o077, 0o022):   # one server for both (and for other files): starting one costs seconds
        work = tmp_path / f"umask{umask:03o}"
        work.mkdir()
        proc = subprocess.run([sys.executable, "-c", JOB.format(experiment=work.name)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600, preexec_fn=lambda m=umask: os.umask(m))
        assert proc.returncode == 0, show(proc)
        assert not [f for f in FRAGMENTS if f in proc.stdout + proc.stderr], show(proc)

        files = [p for p in (work / "runs").rglob("*") if p.is_file()]
        assert {"tracking.json", "config.yaml", "summary.json", "report.json"} <= {p.name for p in files}
        for path in files:
            assert not [f for f in FRAGMENTS if f.encode() in path.read_bytes()], path
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & umask == 0, f"{path} is {oct(mode)} under umask {oct(umask)}"
        for folder in ("mlp", "mlp-int8"):
            saved = json.loads((work / "runs" / folder / "tracking.json").read_text())
            assert saved["uri"] == url.replace("http://", "http://alice:***@")
        if umask == 0o022:   # the umask is followed, not replaced by a private mode for everything
            assert stat.S_IMODE((work / "runs" / "mlp" / "summary.json").stat().st_mode) == 0o644

        experiment = client.get_experiment_by_name(work.name)
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["mlp", "mlp-int8"]
        for run in runs:
            texts = [*run.data.params.values(), *run.data.tags.values()]
            assert not [t for t in texts for f in FRAGMENTS if f in t], run.info.run_name
        compressed = next(r for r in runs if r.info.run_name == "mlp-int8")
        uploaded = Path(client.download_artifacts(compressed.info.run_id, "tracking.json", str(work)))
        assert not [f for f in FRAGMENTS if f in uploaded.read_text()]
