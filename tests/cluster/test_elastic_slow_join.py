"""Tier 3: a worker joins a running elastic job (Gloo, one machine) and takes longer to load its data than
the Gloo rendezvous timeout the others wait in: the job goes on, and finishes on three workers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from support.paths import BIN, ROOT
from support.processes import kill_tree
from support.waiting import wait_for
from test_elastic import finished, pids_training_since, probe_lines, rewrite

GLOO_TIMEOUT_S = 10     # the old bound: the survivors' rendezvous gave up this long after the reset
SLOW_LOAD_S = 12        # the joiner's data loading, longer than that


def test_a_worker_slower_to_load_than_the_rendezvous_timeout_joins_and_the_job_goes_on(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    (tmp_path / "hold").touch()         # slow steps (elastic_probe) until the joiner trains
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(ROOT / "hostfiles" / "discover-hosts.sh"), "--gloo",
           "--network-interfaces", "lo", "--gloo-timeout-seconds", str(GLOO_TIMEOUT_S), "--start-timeout", "120",
           "--disable-cache", sys.executable, "-m", "hvdtrain", "--elastic", "true",
           "--dataset", "slow_join:slow_on_joiner", "--model", "elastic_probe:probe_mlp", "--hidden", "64",
           "--epochs", "2", "--batch-size", "16", "--commit-steps", "5", "--threads", "1",
           "--run-dir", str(tmp_path), "--name", "elastic"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HVDTRAIN_HOSTS_FILE=str(hosts),
               PYTHONPATH=str(ROOT / "tests" / "plugins"), ELASTIC_PROBE_LOG=str(tmp_path / "probe"),
               ELASTIC_PROBE_HOLD=str(tmp_path / "hold"), SLOW_JOIN_HOST="127.0.0.1",
               SLOW_JOIN_S=str(SLOW_LOAD_S), SLOW_JOIN_LOG=str(tmp_path / "loads.jsonl"))
    with (tmp_path / "horovodrun.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(lambda: len(pids_training_since(tmp_path, 0)) == 2, 120, "two workers training")
        first_two = pids_training_since(tmp_path, 0)
        joined_at = time.time()
        rewrite(hosts, "localhost:2\n127.0.0.1:1\n")
        wait_for(lambda: len(pids_training_since(tmp_path, joined_at) - first_two) == 1 or proc.poll() is not None,
                 SLOW_LOAD_S + 90, "the joining worker to train")
        (tmp_path / "hold").unlink()
        summary = finished(proc, tmp_path, timeout=120)
        loads = [json.loads(line) for line in (tmp_path / "loads.jsonl").read_text().splitlines()]
        joiner = [load for load in loads if load["host"] == "127.0.0.1"]
        assert joiner and joiner[0]["load_s"] > GLOO_TIMEOUT_S, loads
        assert summary["workers"] == 3 and len(set(summary["param_digests"])) == 1, summary
        assert len(pids_training_since(tmp_path, joined_at) - first_two) == 1, probe_lines(tmp_path)[-5:]
    finally:
        kill_tree(proc, signal.SIGKILL)
