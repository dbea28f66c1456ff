"""`hvdtrain launch` with a real horovodrun: its secrets file does not outlive a hangup of the launcher."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support.paths import BIN, ROOT
from support.processes import kill_tree


def test_a_hangup_of_hvdtrain_launch_stops_the_job_and_removes_its_secrets_file(tmp_path):
    secrets = tmp_path / "secrets"
    started = tmp_path / "started"
    worker = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(120)"
    launcher = subprocess.Popen(
        [str(BIN / "hvdtrain"), "launch", "--secrets-dir", str(secrets), "-np", "1", "-H", "localhost:1", "--gloo",
         "--network-interfaces", "lo", sys.executable, "-c", worker],
        cwd=ROOT, env=dict(os.environ, HF_TOKEN="hf_not_for_the_process_list"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():  # the worker runs, so the file is in use
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0]
            time.sleep(0.2)
        assert len(list(secrets.iterdir())) == 1
        launcher.send_signal(signal.SIGHUP)  # the terminal closed
        launcher.wait(timeout=60)
        assert list(secrets.iterdir()) == [], "the secrets file outlived the launcher"
    finally:
        kill_tree(launcher, 9)
