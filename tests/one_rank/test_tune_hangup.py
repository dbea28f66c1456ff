"""`hvdtrain tune` (job mode, a real horovodrun trial) hung up mid-trial: its secrets file goes with it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support.paths import ROOT
from support.processes import kill_tree

from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV


def test_a_hangup_of_hvdtrain_tune_stops_its_trial_and_removes_the_secrets_file(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.1, log: true}\n")
    study = tmp_path / "study"
    tune = subprocess.Popen(
        [sys.executable, "-m", "hvdtrain", "tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(study),
         "--trials", "1", "--np", "1", "--model", "mlp", "--threads", "1", "--tensorboard", "false",
         "--epochs", "100000", "--checkpoint-epochs", "0"],
        cwd=ROOT, env=dict(os.environ, HF_TOKEN="hf_not_for_the_process_list", PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        metrics = study / "trials" / "trial-0000" / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not metrics.exists():     # the trial trains: its workers have read the secrets file
            assert tune.poll() is None and time.monotonic() < deadline, tune.communicate()[0]
            time.sleep(0.3)
        secrets = [p for p in study.iterdir() if p.name.startswith(".hvdtrain-secrets-")]
        assert len(secrets) == 1 and secrets[0].stat().st_mode & 0o077 == 0
        log = (study / "trials" / "trial-0000.log").read_text()
        assert SECRETS_FILE_ENV not in log and "hf_not_for_the_process_list" not in log
        tune.send_signal(signal.SIGHUP)     # the terminal closed
        output = tune.communicate(timeout=120)[0]
        assert tune.returncode == 130, output
        assert not secrets[0].exists(), "the secrets file outlived the tune process"
        assert "re-run the same command to resume" in output
    finally:
        kill_tree(tune, 9)
