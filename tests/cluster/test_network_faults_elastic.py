"""A partition or a frozen worker under elastic training (issue 29): one of three real hosts cut off (or its
worker stopped with SIGSTOP) for at least 20 s and until the other two train on without it, then healed.

The survivors must shrink to two and train on, the healed host must be re-admitted, every epoch's samples
must be trained exactly once counting from the last commit, and all ranks must end with equal weights.
Three hosts are network namespaces with sshd (tests/support/netns_cluster.py); the partition is host3's interface
taken down inside its namespace, brought up again in a `finally` (a frozen worker gets its SIGCONT there
too). The probe plug-in (tests/plugins/elastic_probe.py) logs the samples of every step; its hold file
keeps steps slow until host3 is back, so the run outlasts the fault however loaded the machine is.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.netns_cluster import running_cluster
from support.paths import ROOT
from support.waiting import wait_for
from test_elastic import effective_steps, epoch_coverage, probe_lines
from test_network_faults import Job, worker_pid

OUTAGE_S = 20
GLOO_TIMEOUT_S = 10      # how long a survivor's collective waits for the lost host before it resets
PEER_TIMEOUT_S = 12     # the driver drops a worker it has not heard from for this long
COOLDOWN_S = ("5", "10")   # Horovod's blacklist cooldown: a dropped host is tried again 10 s later
EPOCHS = 6


@pytest.fixture(scope="module")
def cluster():
    with running_cluster(hosts=3) as made:
        yield made


def elastic_job(cluster, tmp_path: Path) -> Job:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("host1:1\nhost2:1\nhost3:1\n")
    launch = ["-np", "3", "--min-np", "2", "--max-np", "3",
              "--host-discovery-script", str(ROOT / "hostfiles" / "discover-hosts.sh"),
              "--gloo-timeout-seconds", str(GLOO_TIMEOUT_S), "--blacklist-cooldown-range", *COOLDOWN_S]
    train = ["--elastic", "true", "--dataset", "elastic_probe:indexed_digits", "--model", "elastic_probe:probe_mlp",
             "--hidden", "256", "--epochs", str(EPOCHS), "--batch-size", "16", "--commit-steps", "5",
             "--threads", "1", "--peer-timeout-s", str(PEER_TIMEOUT_S)]
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'plugins'}", "HVDTRAIN_HOSTS_FILE": str(hosts),
           "ELASTIC_PROBE_LOG": str(tmp_path / "probe"), "ELASTIC_PROBE_HOLD": str(tmp_path / "hold")}
    return Job(cluster, tmp_path, "gloo", "elastic", train, launch_args=launch, env=env)


def training_pids(lines: list[dict], since: float, until: float = float("inf")) -> set[str]:
    return {line["pid"] for line in lines if since < line["t"] < until}


# "freeze" once ended with exit 1 after "done" (1 run in 5): a survivor still in Horovod's READY state for
# the round was terminated by the driver's stop and its exit (255) counted as the job's result, a race in
# Horovod 0.28.1's elastic driver at the end of a job. hvdtrain's driver wrapper no longer counts a worker
# its stop terminated once the job succeeded (launcher/elastic_driver.py EndInSuccess), so both run by default.
FAULTS = ["partition", "freeze"]


# The same watch drops a silent worker either way: the partition in the default run, the freeze in the long tier.
@pytest.mark.parametrize("fault", [fault if fault == "partition" else pytest.param(fault, marks=pytest.mark.long)
                                   for fault in FAULTS])
def test_elastic_a_host_cut_off_or_frozen_is_dropped_the_others_train_on_then_it_is_readmitted_no_sample_lost(
        cluster, tmp_path, fault):
    host3 = cluster.workers[2]
    (tmp_path / "hold").touch()
    job = elastic_job(cluster, tmp_path)
    frozen = None
    try:
        wait_for(lambda: len(training_pids(probe_lines(tmp_path), 0)) == 3 and len(probe_lines(tmp_path)) > 3 * 8,
                 240, "three workers training")
        lost = f".{worker_pid(cluster, 'host3')}"   # as the probe names its log files
        cut, cut_wall = time.monotonic(), time.time()
        if fault == "partition":
            cluster.partition(host3)
        else:   # a swap storm or a debugger: the worker stops, its host and links stay up
            frozen = int(lost[1:])
            os.kill(frozen, signal.SIGSTOP)
        before = training_pids(probe_lines(tmp_path), 0, cut_wall)
        # The outage lasts until the survivors train without host3, so "they went on alone, before it was
        # back" is seen whatever the load: on a quiet machine that is ~12 s after the cut, in a loaded CI run
        # it was once 37 s, past a fixed 20 s outage (the host was healed first, so the test could not tell).
        wait_for(lambda: time.monotonic() > cut + OUTAGE_S and len(training_pids(
                     probe_lines(tmp_path), cut_wall + GLOO_TIMEOUT_S) & (before - {lost})) == 2,
                 240, "the two survivors training while host3 is out")
    finally:
        healed_wall = time.time()
        cluster.heal(host3)
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
    try:
        # The job went on without host3's worker; once the host is back, Horovod starts a new one there.
        # A few steps of the re-formed world before the fast finish: a job that ends while a world is still
        # forming meets the end-of-job race described above FAULTS.
        wait_for(lambda: sum(line["pid"] not in before for line in probe_lines(tmp_path)) >= 6, 240,
                 "host3 re-admitted")
    finally:
        (tmp_path / "hold").unlink()
    code, ended = job.finish(300)
    lines = probe_lines(tmp_path)
    readmitted_wall = min(line["t"] for line in lines if line["t"] > cut_wall and line["pid"] not in before)
    # The survivors; a frozen worker logs the step it was stopped in once it runs again, then leaves.
    shrunk = training_pids(lines, cut_wall + GLOO_TIMEOUT_S, readmitted_wall) - {lost}
    back = min(line["t"] for line in lines if line["t"] > cut_wall + GLOO_TIMEOUT_S and line["pid"] in shrunk)
    print(f"\nelastic, host3 {fault} for {healed_wall - cut_wall:.1f} s (--gloo-timeout-seconds {GLOO_TIMEOUT_S}, "
          f"--peer-timeout-s {PEER_TIMEOUT_S}): two workers training {back - cut_wall:.1f} s after the fault, "
          f"a new one on host3 {readmitted_wall - cut_wall:.1f} s after it; the job ended {ended - cut:.1f} s after "
          f"it, exit {code}")
    for line in (line for _, line in job.lines if "is not counted as a failure" in line):
        print(f"the end-of-job race met (and absorbed): {line}")
    assert code == 0, job.text()[-6000:]
    assert shrunk == before - {lost} and len(shrunk) == 2, (shrunk, before, lost)  # the survivors went on alone,
    assert back < healed_wall, job.text()[-6000:]                                    # before host3 was back
    dropped = [line for _, line in job.lines if "has not been heard from" in line]
    assert len(dropped) == 1 and "host host3" in dropped[0], dropped
    summary = json.loads((job.run / "summary.json").read_text())
    assert summary["workers"] == 3 and len(set(summary["param_digests"])) == 1, summary
    coverage = epoch_coverage(job.run, effective_steps(lines))
    assert len(coverage) == EPOCHS
    for epoch, missing, repeated in coverage:
        assert not missing and not repeated, (epoch, missing[:10], repeated[:10])
