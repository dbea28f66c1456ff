"""An elastic job's run folder stays locked when its rank 0 moves (issue 36 item 10): the new rank 0 takes the
lock over from the job's first one (output/claim.py Handover), and refuses a lock of another job.

Every other holder is a real process (flock is per open file; the kernel drops it when the process dies), as the
first rank 0 and a concurrent `--resume auto --name X` are.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from support.paths import ROOT

from hvdtrain.errors import UserError
from hvdtrain.output import claim

HOLD = """
import sys, time
from hvdtrain.output import claim
claim.claim(sys.argv[1], fresh=False, job=sys.argv[2])
print("held", flush=True)
time.sleep(120)
"""
RESUME = """
import sys
from hvdtrain.errors import UserError
from hvdtrain.output import claim
try:
    claim.claim(sys.argv[1], fresh=False)
except UserError as err:
    print(err)
    sys.exit(2)
print("claimed")
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def holders():
    """Processes that hold a run folder, as a job's first rank 0 does; killed (by pid) after the test."""
    started: list[subprocess.Popen] = []

    def hold(folder, job: str) -> subprocess.Popen:
        proc = subprocess.Popen(python(HOLD, str(folder), job), env=env(), stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None
        lines = []   # a note may come first ("taking it over"); EOF ends the loop too
        for line in proc.stdout:
            lines.append(line.strip())
            if lines[-1] == "held":
                return proc
        raise AssertionError(f"the holder did not hold {folder}: {lines}")

    yield hold
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)   # a lost worker: the kernel drops its lock, the file stays as it was
    proc.wait()


def concurrent_resume(folder) -> subprocess.CompletedProcess:
    """`--resume auto --name X` of another job, as its rank 0 claims the folder."""
    return subprocess.run(python(RESUME, str(folder)), env=env(), capture_output=True, text=True, timeout=60)


def test_a_lost_first_rank_0s_lock_is_taken_over_by_the_new_one_and_a_concurrent_resume_refused(
        tmp_path, holders, caplog):
    run = tmp_path / "runs" / "x"
    first = holders(run, "job1")
    kill(first)
    assert concurrent_resume(run).returncode == 0   # before this fix: the folder was anyone's from here on
    first = holders(run, "job1")
    kill(first)
    hand = claim.Handover(run, "job1")
    hand.take()
    try:
        assert hand.token is not None and hand.thread is None
        assert claim.job_of((run / claim.LOCK).read_text()) == "job1"
        assert f"pid {os.getpid()}" in (run / claim.LOCK).read_text()
        refused = concurrent_resume(run)
        assert refused.returncode == 2 and "is in use by another run" in refused.stdout, refused
        assert f"pid {os.getpid()}" in refused.stdout and "job job1" in refused.stdout
        assert any("rank 0 moved to this process" in r.getMessage() for r in caplog.records)
    finally:
        hand.release()
    assert not (run / claim.LOCK).exists()
    assert concurrent_resume(run).returncode == 0   # the job over: the folder is free again


def test_while_the_old_rank_0_lives_the_lock_is_taken_the_moment_it_lets_go(tmp_path, holders, monkeypatch):
    monkeypatch.setattr(claim, "HANDOVER_POLL_S", 0.05)
    run = tmp_path / "x"
    first = holders(run, "job1")   # lost to the job (frozen, cut off) but not yet ended
    hand = claim.Handover(run, "job1")
    hand.take()
    try:
        assert hand.token is None and hand.thread is not None
        assert concurrent_resume(run).returncode == 2   # the old holder's lock still keeps it out
        kill(first)
        deadline = time.monotonic() + 10
        while hand.token is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hand.token is not None and hand.lost_to is None
        refused = concurrent_resume(run)
        assert refused.returncode == 2 and f"pid {os.getpid()}" in refused.stdout, refused
    finally:
        hand.release()
    assert hand.thread is not None and not hand.thread.is_alive()


def test_the_first_rank_0_still_rank_0_keeps_its_own_claim(tmp_path):
    from hvdtrain.config.train_config import TrainConfig
    from hvdtrain.output.run_directory import RunDirectory, RunDirSettings

    with RunDirectory(RunDirSettings.of(TrainConfig(run_dir=str(tmp_path), name="x"))) as run:
        verdict = run.decide()
        run.adopt(verdict, is_root=True)
        assert run.hold(is_root=True) is None and run._handover is None   # its own claim: no handover
        assert claim.job_of((tmp_path / "x" / claim.LOCK).read_text()) == verdict.job
    assert not (tmp_path / "x").exists()   # close() gave back the folder it made and never wrote


def test_a_lock_another_job_holds_is_refused_in_one_line(tmp_path, holders):
    run = tmp_path / "x"
    holders(run, "job2")
    hand = claim.Handover(run, "job1")
    with pytest.raises(UserError, match=r"^run directory .*x is in use by another run \(pid \d+ on .*, job job2\) "
                                        r"since this elastic job's rank 0 changed") as err:
        hand.take()
    assert "\n" not in str(err.value) and hand.token is None and hand.thread is None


def test_a_lock_another_job_left_is_refused_and_left_as_it_was(tmp_path, holders):
    run = tmp_path / "x"
    kill(holders(run, "job2"))   # another run used the folder after this job's rank 0 was lost, and ended
    before = (run / claim.LOCK).read_text()
    with pytest.raises(UserError, match="was used by another run .*job job2.* rather than mix"):
        claim.Handover(run, "job1").take()
    assert (run / claim.LOCK).read_text() == before
    assert concurrent_resume(run).returncode == 0   # nothing of this job's holds it


def test_the_verdict_carries_the_job_id_written_in_the_lock_and_travels_pickled(tmp_path):
    import pickle

    from hvdtrain.config.train_config import TrainConfig
    from hvdtrain.output.run_directory import RunDirectory, RunDirSettings

    with RunDirectory(RunDirSettings.of(TrainConfig(run_dir=str(tmp_path), name="x"))) as run:
        verdict = run.decide()
        assert verdict.job and claim.job_of((tmp_path / "x" / claim.LOCK).read_text()) == verdict.job
        assert pickle.loads(pickle.dumps(verdict)) == verdict and run.decide() is verdict


def test_the_examples_in_claim_run():
    import doctest

    result = doctest.testmod(claim)
    assert result.attempted and not result.failed
