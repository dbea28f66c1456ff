"""Tier 3: killed mid-epoch and resumed, a run ends with the weights of one never stopped, also when the
workers do not divide the training set (issue 36, item 0).

The epoch's last step then trains padding samples; they once wrapped around from the resume position, not
from the epoch's first sample, and the final weights differed (1,437 digits on 2 workers: 8.4e-5; 3,277
synthetic samples: 1.6e-2). Each case: an uninterrupted run, the same job stopped just after its step-10
checkpoint (every rank held at step 13 by faults:slow_mlp, so the kill point does not depend on the
machine's speed), then `--resume auto`; the final model.pt tensors agree to 1e-6.

Cases (each is three launches, 25-90 s on 2 busy cores): in the default run 1,437 samples on 2 Gloo workers
(1 padding sample), 3,277 on 3 MPI workers (2), and a SIGTERM stop (the ranks agree on a step and write a
checkpoint) instead of SIGKILL; in the long tier (marked `long`, make test-all) 1,437 on 2 MPI workers, 3,277
on 2 MPI and 3 Gloo workers, and 1,437 on 3 Gloo workers, which divides evenly (the control that passed before
the fix too).
"""
from __future__ import annotations

import re
import signal

import psutil
import pytest
from support.paths import PLUGINS
from support.processes import horovodrun, kill_tree, show
from support.runs import STOPPABLE_DIGITS, assert_same_weights
from support.waiting import wait_for

# Digits on 2 workers: 719 samples a rank, 23 steps an epoch (STOPPABLE_DIGITS, batch 32); synthetic, the same job on
# 4,096 samples (3,277 for training) at batch 64: 1,639 a rank, 26 steps an epoch.
DIGITS = ["-m", "hvdtrain", *STOPPABLE_DIGITS]
SYNTHETIC = ["-m", "hvdtrain", "--dataset", "synthetic", "--synthetic-samples", "4096", "--synthetic-shape", "1,8,8",
             "--batch-size", "64", "--model", "faults:slow_mlp", "--hidden", "16", "--epochs", "2",
             "--checkpoint-steps", "10", "--keep-checkpoints", "10", "--threads", "1", "--log-interval", "1"]
HOLD_AFTER = 12     # training forward passes (= steps here) before every rank waits on the hold file
CASES = {
    "digits-1437-gloo-2": (DIGITS, "gloo", 2),
    "digits-1437-gloo-3": (DIGITS, "gloo", 3),
    "synthetic-3277-mpi-2": (SYNTHETIC, "mpi", 2),
    "synthetic-3277-gloo-3": (SYNTHETIC, "gloo", 3),
    "digits-1437-mpi-2": (DIGITS, "mpi", 2),
    "synthetic-3277-mpi-3": (SYNTHETIC, "mpi", 3),
}
# The default run keeps one case per backend, worker count and padding (2 Gloo workers, 3 MPI workers); the
# others, and the even control, are the long tier (make test-all).
LONG_CASES = {"digits-1437-gloo-3", "synthetic-3277-mpi-2", "synthetic-3277-gloo-3", "digits-1437-mpi-2"}


def job(case: str, run_dir, name: str) -> list[str]:
    return [*CASES[case][0], "--run-dir", str(run_dir), "--name", name]


def reference(uninterrupted, case: str) -> dict:
    """The final weights of the case's job run without a stop (conftest's session fixture, once per job)."""
    args, backend, np = CASES[case]
    return uninterrupted(args, np, backend)


def workers(proc) -> list[psutil.Process]:
    """The training processes under horovodrun (not the launcher, shells or mpirun's daemons)."""
    return [p for p in psutil.Process(proc.pid).children(recursive=True)
            if p.cmdline()[1:3] == ["-m", "hvdtrain"]]


def stopped_after_step_10(tmp_path, background, case: str, sig: int):
    """Start the case, hold every rank after step 12 (the step-10 checkpoint written), then SIGKILL every
    process, or SIGTERM the training processes and let them go on to stop together. Returns the log."""
    _, backend, np = CASES[case]
    hold, log = tmp_path / "hold", tmp_path / "first.log"
    hold.touch()
    proc = background(np, job(case, tmp_path, "run"), backend, log,
                      env={**PLUGINS, "FAULTS_SLEEP_S": "0", "FAULTS_HOLD_FILE": str(hold),
                           "FAULTS_HOLD_AFTER": str(HOLD_AFTER)})
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "ckpt-000000010.pt").exists() or proc.poll() is not None,
             timeout=240)
    assert proc.poll() is None, "the job ended before the planned stop:\n" + log.read_text()[-3000:]
    if sig == signal.SIGKILL:
        kill_tree(proc, signal.SIGKILL)     # every rank and the launcher at once, no cleanup
    else:
        ranks = wait_for(lambda: len(workers(proc)) == np and workers(proc), 120, f"the {np} workers", every=0.02)
        for rank in ranks:
            rank.send_signal(sig)           # as a scheduler would; they agree on it at the next step
        hold.unlink()
        proc.wait(timeout=120)
        assert proc.returncode != 0, log.read_text()[-3000:]
    return log.read_text()


@pytest.mark.parametrize("case", [pytest.param(case, marks=[pytest.mark.long] if case in LONG_CASES else [])
                                  for case in CASES])
def test_sigkill_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path, background, uninterrupted, case):
    stopped_after_step_10(tmp_path, background, case, signal.SIGKILL)
    _, backend, np = CASES[case]
    proc = horovodrun(np, [*job(case, tmp_path, "run"), "--resume", "auto"], backend,
                      env={**PLUGINS, "FAULTS_SLEEP_S": "0"})
    assert proc.returncode == 0, show(proc)
    assert "ckpt-000000010.pt at epoch 1, step 10" in proc.stdout and "exactly where it stopped" in proc.stdout, \
        show(proc)
    assert_same_weights(tmp_path / "run", reference(uninterrupted, case))


def test_sigterm_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path, background, uninterrupted):
    case = "digits-1437-gloo-2"
    log = stopped_after_step_10(tmp_path, background, case, signal.SIGTERM)
    stop = re.search(r"\[0\]<stderr>:hvdtrain: stopped by SIGTERM at step (\d+); checkpoint ", log)
    assert stop and int(stop[1]) > 10, log[-3000:]     # its own checkpoint, after the step-10 one
    _, backend, np = CASES[case]
    proc = horovodrun(np, [*job(case, tmp_path, "run"), "--resume", "auto"], backend,
                      env={**PLUGINS, "FAULTS_SLEEP_S": "0"})
    assert proc.returncode == 0, show(proc)
    assert f"step {stop[1]} (" in proc.stdout and "exactly where it stopped" in proc.stdout, show(proc)
    assert_same_weights(tmp_path / "run", reference(uninterrupted, case))
