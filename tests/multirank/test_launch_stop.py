"""Tier 3: `hvdtrain launch` stops its workers through hvdtrain's stop (launcher/shell_stop.py), not Horovod's.

Each worker, on SIGTERM, freezes its own shell with SIGSTOP and exits 143: the state Horovod 0.28.1's stop can
leave a shell in when it catches it between its worker's exit and its own (its SIGSTOP). Horovod's stop then waits
the whole grace for that shell (here 30 s) and SIGKILLs it; hvdtrain's sends SIGCONT with the shell's SIGTERM, so
the job ends within moments of its workers, with horovodrun's exit code for a failed job. The workers do not use
Horovod: the launcher is what is tested. One launch of 2 processes, a few seconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.paths import BIN

GRACE_S = 30
WORKER = """
import os, signal, sys, time
def on_term(signum, frame):
    os.kill(os.getppid(), signal.SIGSTOP)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_job_whose_shells_are_frozen_ends_at_once_and_fails(tmp_path: Path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    log_path = tmp_path / "launch.log"
    env = {**os.environ, "HVDTRAIN_GRACE_S": str(GRACE_S), "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(BIN / "hvdtrain"), "launch", "-np", "2", "-H", "localhost:2", "--gloo",
                                 "--network-interfaces", "lo", "--disable-cache", sys.executable, str(worker)],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while log_path.read_text().count("ready") < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert log_path.read_text().count("ready") == 2, log_path.read_text()[-3000:]
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=GRACE_S + 60)
            took = time.monotonic() - stopped
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = log_path.read_text()
    assert code == 1 and "Process 0 exit with status code 143." in out, out[-3000:]
    assert took < GRACE_S / 2, f"the job took {took:.1f} s to end after SIGTERM (grace {GRACE_S} s):\n{out[-3000:]}"
