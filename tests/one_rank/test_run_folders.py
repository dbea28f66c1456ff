"""One run per folder, with real processes started together: the second gets one line, never the folder."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.paths import ROOT
from support.processes import kill_tree
from support.runs import records

JOB = ["--dataset", "synthetic", "--synthetic-samples", "256", "--synthetic-shape", "1,8,8", "--model", "mlp",
       "--hidden", "16", "--threads", "1", "--progress-bar", "off"]


def start(run_dir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hvdtrain", *JOB, "--run-dir", str(run_dir), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


# Each attempt is one more roll of the race; 2 a run keeps it in the default run, 5 is the long form.
@pytest.mark.parametrize("attempts", [2, pytest.param(5, marks=pytest.mark.long)])
@pytest.mark.parametrize("resume", [[], ["--resume", "auto"]], ids=["new", "resume"])
def test_two_runs_with_the_same_name_started_together_never_share_the_folder(tmp_path, resume, attempts):
    for attempt in range(attempts):
        runs = tmp_path / str(attempt)
        procs = [start(runs, "--name", "same", "--epochs", "20", *resume) for _ in range(2)]
        results = [(proc.wait(timeout=300), *proc.communicate()) for proc in procs]
        codes = sorted(code for code, _, _ in results)
        report = "\n".join(f"exit {code}\n{out[-2000:]}\n{err[-2000:]}" for code, out, err in results)
        assert codes == [0, 2], report
        refused = next(err for code, _, err in results if code == 2)
        assert len(refused.strip().splitlines()) == 1, refused
        # the second came after the first had finished: a new run is refused the folder, a resume has no work
        assert any(why in refused for why in ("is in use by another run", "already holds a run",
                                              "nothing to do: the run already finished 20 of 20 epochs")), refused
        written = records(runs / "same")
        assert [r["kind"] for r in written].count("summary") == 1 and [
            r["epoch"] for r in written if r["kind"] == "epoch"] == list(range(20))
        assert not (runs / "same" / ".hvdtrain.lock").exists()


def test_a_second_run_cannot_sweep_the_temp_files_of_the_run_that_holds_the_folder(tmp_path):
    holder = start(tmp_path, "--name", "shared", "--epochs", "100000", "--checkpoint-epochs", "0")
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "shared" / "config.yaml").exists():  # the holder is training
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.5)
        mid_write = tmp_path / "shared" / "checkpoints" / ".ckpt-000000007.tmp"
        mid_write.parent.mkdir(exist_ok=True)
        mid_write.write_bytes(b"the holder's checkpoint, half written")
        second = subprocess.run([sys.executable, "-m", "hvdtrain", *JOB, "--run-dir", str(tmp_path), "--name",
                                 "shared", "--resume", "auto", "--checkpoint-steps", "1", "--max-steps", "2"],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is in use by another run (pid " in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert mid_write.read_bytes() == b"the holder's checkpoint, half written"
        assert holder.poll() is None
    finally:
        kill_tree(holder, 9)
