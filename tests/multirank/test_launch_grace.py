"""Tier 3: SIGTERM to `hvdtrain launch` (horovodrun, not the workers) mid-epoch while the stop checkpoint takes
8 s to write, longer than the 5 s Horovod's launcher waits before it kills its workers (issue 39).

faults:slow_mlp holds every rank after step 12 (the step-10 checkpoint written) and, with FAULTS_SAVE_SLEEP_S=8,
takes 8 s over the weights once a stop was noted. With Horovod's own grace rank 0 is killed mid-write: only the
step-10 checkpoint is there (the control: the test would pass without the option otherwise). With
`--grace-s 30` the stop checkpoint is complete and `--resume auto` ends with the weights of the run that was
never stopped (1e-6). Four launches of 2 Gloo workers, ~25 s each on 2 busy cores.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from support.paths import BIN, PLUGINS_DIR, ROOT
from support.processes import show
from support.runs import STOPPABLE_DIGITS, assert_same_weights
from support.waiting import wait_for

# 1,437 digits on 2 workers, 32 a worker: 23 steps an epoch, a checkpoint every 10 steps.
JOB = ["-m", "hvdtrain", *STOPPABLE_DIGITS]
SAVE_SLEEP_S = 8


def launch(run_dir: Path, name: str, *extra: str, grace: str = "") -> list[str]:
    return [str(BIN / "hvdtrain"), "launch", *(["--grace-s", grace] if grace else []), "-np", "2",
            "-H", "localhost:2", "--gloo", "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo",
            str(BIN / "python"), *JOB, "--run-dir", str(run_dir), "--name", name, *extra]


def env(**extra: str) -> dict[str, str]:
    base = {key: value for key, value in os.environ.items() if key != "HVDTRAIN_GRACE_S"}
    return {**base, "PYTHONPATH": f"{ROOT}{os.pathsep}{PLUGINS_DIR}", "PYTHONUNBUFFERED": "1", "FAULTS_SLEEP_S": "0",
            **extra}


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)


def term_launch_mid_epoch(tmp_path: Path, grace: str) -> tuple[str, Path]:
    """Hold the job after its step-10 checkpoint, SIGTERM `hvdtrain launch`, let it stop. Returns its log."""
    hold, log_path = tmp_path / "hold", tmp_path / "first.log"
    hold.touch()
    with log_path.open("w") as log:
        proc = subprocess.Popen(launch(tmp_path, "run", grace=grace), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env=env(FAULTS_HOLD_FILE=str(hold), FAULTS_HOLD_AFTER="12",
                                        FAULTS_SAVE_SLEEP_S=str(SAVE_SLEEP_S)))
        try:
            wait_for(lambda: (tmp_path / "run" / "checkpoints" / "ckpt-000000010.pt").exists()
                     or proc.poll() is not None, timeout=240)
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(1)                           # every rank reaches the hold
            proc.send_signal(signal.SIGTERM)        # the launcher only: horovodrun passes it on
            hold.unlink()
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log_path.read_text(), tmp_path / "run" / "checkpoints"


def test_horovods_own_5_s_grace_kills_rank_0_mid_checkpoint(tmp_path):
    out, ckpts = term_launch_mid_epoch(tmp_path, grace="")
    assert "[1]<stderr>:hvdtrain: stopped by SIGTERM at step" in out, out[-3000:]
    assert not re.search(r"\[0\]<stderr>:hvdtrain: stopped by SIGTERM at step \d+; checkpoint", out), out[-3000:]
    assert sorted(p.name for p in ckpts.glob("ckpt-*.pt")) == ["ckpt-000000010.pt"]


def test_grace_s_lets_the_stop_checkpoint_finish_and_the_resume_is_exact(tmp_path, uninterrupted):
    out, ckpts = term_launch_mid_epoch(tmp_path, grace="30")
    stop = re.search(r"\[0\]<stderr>:hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", out)
    assert stop and int(stop[1]) > 10, out[-3000:]
    assert (ckpts / f"ckpt-{int(stop[1]):09d}.pt").exists()
    proc = run(launch(tmp_path, "run", "--resume", "auto"))
    assert proc.returncode == 0, show(proc)
    assert f"step {stop[1]} (" in proc.stdout and "exactly where it stopped" in proc.stdout, show(proc)
    assert_same_weights(tmp_path / "run", uninterrupted(JOB))   # the same job under horovodrun
