"""Ray: hvdtrain.ray.fit and `hvdtrain ray` on a real Ray cluster: a head and two worker nodes, each its own
`ray start` process with its own node id and loopback address (tests/support/ray_cluster.py).

ray is a default extra of `make setup`, so it is imported, not skipped.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import ray  # noqa: F401 - a missing ray is a setup bug (EXTRAS in the Makefile), not a skip
from support.paths import ROOT
from support.processes import show
from support.ray_cluster import RayCluster, fit_and_report
from support.waiting import wait_for
from test_spark import SHORT_EPOCHS, short_default_job  # noqa: F401 - the fixture: one reference run for both

import hvdtrain
import hvdtrain.ray

# A rank lost with its node must surface as a WorkerError within this, never a hang: Ray reports the
# actor dead once its raylet is gone, and the surviving rank's Gloo connection to it breaks at once.
LOST_NODE_BOUND_S = 90


@pytest.fixture(scope="module")
def ray_nodes():
    # Short: Ray's Unix socket paths (under the temp dir) must stay under 108 characters.
    folder = Path(tempfile.mkdtemp(prefix="hvdray-", dir="/tmp"))
    nodes = RayCluster(folder, workers=2)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def cluster(ray_nodes):
    """The module's cluster with two live worker nodes: a test that killed one leaves it to be replaced here, so
    the tests pass in any order (a shuffled run put the node kill first)."""
    ray_nodes.top_up(2)
    return ray_nodes


def _node_ids(cluster: RayCluster) -> dict[str, str]:
    """Node id -> node IP, from the head's state API."""
    from ray.util.state import list_nodes

    return {n.node_id: n.node_ip for n in list_nodes(address=cluster.dashboard)}


@pytest.mark.parametrize("args, message", [
    (["--np", "0"], "ray: --np must be >= 1, got 0"),
    (["--cpus-per-worker", "0"], "ray: each worker needs a CPU or a GPU; give --cpus-per-worker or "
                                 "--gpus-per-worker"),
    (["--address", "127.0.0.10:1"], "cannot reach a Ray cluster at 127.0.0.10:1 (Connection refused); start one "
                                    "with `ray start --head` there, or give its GCS address (HOST:6379) or "
                                    "ray://HOST:10001"),
    (["--elastic", "true", "--min-np", "3"], "elastic needs 1 <= min_workers <= num_workers <= max_workers, got 3, "
                                             "2, 2"),
    (["--min-np", "0"], "ray: --min-np must be >= 1, got 0"),
])
def test_ray_cli_bad_arguments_are_one_line_before_ray_starts(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "ray", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == f"hvdtrain: error: {message}", show(proc)


def test_two_actors_on_two_nodes_train_like_launch_and_no_credential_reaches_ray(cluster, tmp_path,
                                                                                  short_default_job):  # noqa: F811
    """Rank 0's History comes back; both actors ran on different worker nodes; the weights equal horovodrun's
    (the default job cut to SHORT_EPOCHS, as in test_spark.py) with the same seed; a credential reaches the workers
    but no command line or Ray metadata."""
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    config = hvdtrain.load_config(run_dir=str(tmp_path), name="ray", threads=1, epochs=SHORT_EPOCHS)
    reports = hvdtrain.ray.fit(fit_and_report, config, "HVDTRAIN_RAYTEST_TOKEN", num_workers=2,
                               address=cluster.address, all_ranks=True, env={"HVDTRAIN_RAYTEST_TOKEN": secret})

    nodes = _node_ids(cluster)
    placed = [r["node_id"] for r in reports]
    assert len(set(placed)) == 2, placed
    assert {nodes[n] for n in placed} == cluster.alive_worker_ips(), (placed, nodes)

    history = reports[0]["history"]
    assert len(history) == SHORT_EPOCHS and history.summary["workers"] == 2
    assert history[-1]["val_samples"] == 359  # the whole held-out split, once
    digests = history.summary["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert json.loads((tmp_path / "ray" / "summary.json").read_text())["param_digests"] == digests

    # Credentials: delivered, and visible nowhere a cluster user could look.
    assert [r["secret"] for r in reports] == [secret, secret]
    assert [r["on_command_lines"] for r in reports] == [[], []]
    from ray.util.state import list_actors, list_jobs, list_placement_groups, list_tasks, list_workers

    for listing in (list_actors, list_tasks, list_workers, list_placement_groups):
        shown = repr(listing(address=cluster.dashboard, detail=True, limit=1000))
        assert secret not in shown, listing.__name__
    assert secret not in repr(list_jobs(address=cluster.dashboard))

    # The same trainer, not a Ray copy of it: horovodrun's workers (the same job as test_spark.py's) end with the
    # very same weights.
    launched = short_default_job.last_epoch()
    assert json.loads((short_default_job.run / "summary.json").read_text())["param_digests"] == digests
    # Exact, not an accuracy bar: the default job's target is test_trainer_multirank's to prove.
    assert launched["val_acc"] == history[-1]["val_acc"], (launched, history.table())
    assert launched["val_loss"] == pytest.approx(history[-1]["val_loss"], abs=1e-6)


def test_ray_job_submit_runs_the_cli_against_the_cluster(cluster, tmp_path):
    """`ray job submit -- hvdtrain ray ...`: the job's driver runs on the head, RAY_ADDRESS set by Ray."""
    proc = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "submit", "--address",
                           cluster.dashboard, "--", "hvdtrain", "ray", "--np", "2", "--epochs", "2",
                           "--run-dir", str(tmp_path), "--name", "job"],
                          env=cluster.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "hvdtrain: ray run done: 2 worker(s)" in proc.stdout, show(proc)
    # Each worker's lines come back tagged with its rank and node.
    nodes = "|".join(map(re.escape, sorted(cluster.alive_worker_ips())))   # 127.0.0.11/12, or their replacements
    tagged = rf"^\(hvdtrain rank 0 on (?:{nodes}) pid=\d+[,)].*hvdtrain: done"   # no colour codes either
    assert re.search(tagged, proc.stdout, re.M), show(proc)
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers"] == 2 and len(set(summary["param_digests"])) == 1, summary


class DriverAttacker(threading.Thread):
    """Issue 51: while the job runs, pickles that would create `marker`, forged registrations and rank_and_size GETs,
    8 GiB bodies and garbage to every TCP port this process (the Ray driver: the elastic rendezvous is one) opens."""

    def __init__(self, marker: Path) -> None:
        import psutil

        super().__init__(daemon=True)
        self.me = psutil.Process()
        self.before = self.listening()
        self.marker, self.stop, self.sent, self.ports = marker, threading.Event(), 0, set()

    def listening(self) -> set[tuple[str, int]]:
        return {("127.0.0.1" if c.laddr.ip in ("0.0.0.0", "") else c.laddr.ip, c.laddr.port)
                for c in self.me.net_connections(kind="tcp4") if c.status == "LISTEN"}

    def run(self) -> None:
        from support.control_attacker import attack_tcp, tcp_requests

        requests = tcp_requests(str(self.marker))
        while not self.stop.wait(1.0):
            targets = sorted(self.listening() - self.before)
            self.ports |= set(targets)
            self.sent += attack_tcp(targets, requests)


def test_elastic_a_lost_node_is_dropped_and_a_joining_node_is_taken_in_with_no_sample_lost(cluster, tmp_path, capfd):
    """Two worker nodes, one killed mid-run, one added; the driver's ports attacked all along."""
    from test_elastic import effective_steps, epoch_coverage, probe_lines

    (tmp_path / "hold").touch()
    config = hvdtrain.load_config(run_dir=str(tmp_path), name="elastic", threads=1, elastic=True, epochs=4,
                                  dataset="elastic_probe:indexed_digits", model="elastic_probe:probe_mlp",
                                  hidden=256, batch_size=16, commit_steps=5)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "plugins")]),
           "ELASTIC_PROBE_LOG": str(tmp_path / "probe"), "ELASTIC_PROBE_HOLD": str(tmp_path / "hold")}
    outcome: dict = {}

    def train() -> None:
        try:
            outcome["history"] = hvdtrain.ray.fit(config, num_workers=2, min_workers=1, address=cluster.address,
                                                  env=env)
        except BaseException as err:  # noqa: B036 - the test thread reports it
            outcome["error"] = err

    attacker = DriverAttacker(tmp_path / "unpickled")
    attacker.start()
    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len({line["pid"] for line in probe_lines(tmp_path)}) == 2 or not thread.is_alive(), 240,
                 "two workers training")
        assert thread.is_alive(), outcome
        victim = [n for n in cluster.alive() if n != "head"][-1]
        killed = time.time()
        cluster.kill(victim)
        before = {line["pid"] for line in probe_lines(tmp_path) if line["t"] < killed}
        wait_for(lambda: any(line["t"] > killed + 1 for line in probe_lines(tmp_path)), 120,
                 "the survivor training on")
        shrunk = min(line["t"] for line in probe_lines(tmp_path) if line["t"] > killed + 1)
        joined_at = time.time()
        cluster.add_worker()
        # A few steps of the re-formed world before the fast finish (a job ending while a world forms can
        # meet Horovod's end-of-job race: tests/cluster/test_network_faults_elastic.py, above FAULTS).
        wait_for(lambda: sum(line["pid"] not in before for line in probe_lines(tmp_path)) >= 6, 180,
                 "a worker on the new node")
        grown = min(line["t"] for line in probe_lines(tmp_path) if line["pid"] not in before)
    finally:
        (tmp_path / "hold").unlink()
        thread.join(timeout=300)
        attacker.stop.set()
        attacker.join(timeout=60)
    print(f"\nelastic on Ray: node killed; one worker training {shrunk - killed:.1f} s later; a node added "
          f"{joined_at - killed:.1f} s after the kill had a worker training {grown - joined_at:.1f} s after it joined")
    assert not thread.is_alive() and "error" not in outcome, outcome
    # The attack landed on the rendezvous and nothing of it ran or ended a rank.
    assert attacker.ports and attacker.sent > 20 and not (tmp_path / "unpickled").exists(), attacker.ports
    assert "the rendezvous refused" in capfd.readouterr().err
    summary = json.loads((tmp_path / "elastic" / "summary.json").read_text())
    assert summary["workers"] == 2 and len(set(summary["param_digests"])) == 1, summary
    assert outcome["history"].summary["workers"] == 2
    coverage = epoch_coverage(tmp_path / "elastic", effective_steps(probe_lines(tmp_path)))
    assert len(coverage) == 4
    for epoch, missing, repeated in coverage:
        assert not missing and not repeated, (epoch, missing[:10], repeated[:10])


def test_a_worker_node_killed_mid_run_is_a_worker_error_naming_rank_and_node(cluster, tmp_path):
    """It kills a node of the shared cluster (the `cluster` fixture starts another for any test after it). Last in
    the file: the elastic test above ends with two live worker nodes (one killed, one added), so in file order no
    replacement node is started (a `ray start` and a GCS poll that cost seconds of CPU on a busy 2-core machine)."""
    proc = subprocess.Popen([sys.executable, "-m", "hvdtrain", "ray", "--address", cluster.address, "--np", "2",
                             "--epochs", "200", "--run-dir", str(tmp_path), "--name", "lost"],
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = tmp_path / "lost" / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and '"epoch"' in metrics.read_text():
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        victim, victim_ip = list(cluster.alive_workers().items())[-1]   # each live worker node runs a rank
        killed = time.monotonic()
        cluster.kill(victim)
        out, err = proc.communicate(timeout=LOST_NODE_BOUND_S)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    last = err.strip().splitlines()[-1]
    print(f"{took:.1f} s after the node was killed: {last}")
    assert re.search(rf"hvdtrain: error: rank [01] on node {re.escape(victim_ip)} \([0-9a-f]{{8}}\)", last), out + err
