"""An elastic job keeps its run folder locked when its rank 0 is lost (issue 36 item 10), for real: Gloo, one
machine, two one-slot hosts (`localhost`, `127.0.0.1`), --min-np 1. The worker that holds the lock (the first
rank 0) is killed; the survivor, rank 0 of the new world, takes the lock over (output/claim.py Handover), and a
concurrent `--resume auto --name` of the same folder is refused while the job runs on; the job ends 0.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from support.paths import BIN, ROOT
from support.processes import kill_tree
from support.waiting import wait_for
from test_elastic import probe_lines

from hvdtrain.output import claim

TRAIN = ["--dataset", "elastic_probe:indexed_digits", "--model", "elastic_probe:probe_mlp", "--hidden", "64",
         "--batch-size", "16", "--commit-steps", "5", "--threads", "1"]


def lock_pid(run: Path) -> int | None:
    try:
        text = (run / claim.LOCK).read_text()
    except FileNotFoundError:
        return None
    return int(text.split()[1]) if text.startswith("pid ") else None


def test_rank_0_lost_the_survivor_takes_the_lock_over_and_a_concurrent_resume_is_refused(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    (tmp_path / "hold").touch()   # slow steps until the test is done with the job
    env = dict(os.environ, PYTHONUNBUFFERED="1", HVDTRAIN_HOSTS_FILE=str(hosts),
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'plugins'}", ELASTIC_PROBE_LOG=str(tmp_path / "probe"),
               ELASTIC_PROBE_HOLD=str(tmp_path / "hold"))
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(ROOT / "hostfiles" / "discover-hosts.sh"), "--gloo",
           "--network-interfaces", "lo", "--gloo-timeout-seconds", "5", "--start-timeout", "120", "--disable-cache",
           sys.executable, "-m", "hvdtrain", "--elastic", "true", *TRAIN, "--epochs", "4",
           "--run-dir", str(tmp_path), "--name", "elastic"]
    run = tmp_path / "elastic"
    log = tmp_path / "horovodrun.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len({line["pid"] for line in probe_lines(tmp_path)}) == 2, 240, "two workers training")
        first = lock_pid(run)
        assert first is not None and psutil.pid_exists(first), log.read_text()[-4000:]
        job = claim.job_of((run / claim.LOCK).read_text())
        assert job, (run / claim.LOCK).read_text()
        os.kill(first, signal.SIGKILL)   # the first rank 0: the kernel drops its lock
        wait_for(lambda: lock_pid(run) not in (None, first), 120, "the survivor holding the lock")
        survivor = lock_pid(run)
        assert claim.job_of((run / claim.LOCK).read_text()) == job
        assert f".{survivor}" in {line["pid"] for line in probe_lines(tmp_path)}   # a worker of this job
        concurrent = subprocess.run([sys.executable, "-m", "hvdtrain", *TRAIN, "--epochs", "8", "--resume", "auto",
                                     "--run-dir", str(tmp_path), "--name", "elastic"], cwd=ROOT, env=env,
                                    capture_output=True, text=True, timeout=300)
        assert concurrent.returncode == 2, concurrent.stdout[-2000:] + concurrent.stderr[-2000:]
        refused = [line for line in concurrent.stderr.splitlines() if "hvdtrain: error:" in line]
        assert len(refused) == 1 and "is in use by another run" in refused[0] and f"pid {survivor}" in refused[0] \
            and f"job {job}" in refused[0], concurrent.stderr[-2000:]
        (tmp_path / "hold").unlink()
        proc.wait(timeout=300)
        text = log.read_text()
        assert proc.returncode == 0, text[-6000:]
        assert "rank 0 moved to this process" in text, text[-6000:]
        assert not (run / claim.LOCK).exists()   # let go at the end, by the process that held it then
    finally:
        kill_tree(proc, signal.SIGKILL)
