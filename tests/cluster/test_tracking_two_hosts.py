"""One MLflow run with system metrics from both hosts of a two-host job. (Issue 27.)

Two real hosts in network namespaces with their own sshd and host names (netns_cluster.py); horovodrun
(Gloo over ssh) starts one worker on each. Rank 0 on host1 holds the run in the embedded sqlite store; host2's
local rank 0 samples its CPU and memory, and the trainer gathers those samples to rank 0 at every epoch's end.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import BIN, ROOT, show
from netns_cluster import IFACE, SSH_PORT
from test_two_hosts import cluster, write_hostfile  # noqa: F401 - cluster is the fixture

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.tracking import system  # noqa: E402

TRAIN = ["--dataset", "synthetic", "--synthetic-samples", "1280", "--synthetic-shape", "1,8,8", "--model", "mlp",
         "--hidden", "32", "--epochs", "3", "--threads", "1", "--log-interval", "5", "--tensorboard", "false"]


def test_one_run_holds_system_metrics_from_both_hosts(cluster, tmp_path):  # noqa: F811
    hostfile = write_hostfile(tmp_path)
    runs = tmp_path / "runs"
    launch = [str(BIN / "horovodrun"), "-np", "2", "--hostfile", str(hostfile), "-p", str(SSH_PORT),
              "-i", str(cluster.key), "--network-interfaces", IFACE, "--start-timeout", "120", "--disable-cache",
              "--gloo", sys.executable, "-m", "hvdtrain", *TRAIN, "--run-dir", str(runs), "--name", "two",
              "--tracking", "mlflow"]
    # horovodrun forwards its environment to every worker: the sampling interval reaches host2's sampler too.
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **{system.INTERVAL_ENV: "0.2"})
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(["ip", "netns", "exec", cluster.launcher.namespace, "unshare", "--uts", "sh", "-c",
                           'hostname launcher && exec "$0" "$@"', *launch],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])   # one run, not one a host
    assert run.info.status == "FINISHED" and run.data.tags["hosts"] == "2" and run.data.tags["workers"] == "2"
    hosts = {name.split("/")[1] for name in run.data.metrics if name.startswith("system/")}
    assert hosts == {"host1", "host2"}, sorted(run.data.metrics)
    for host in hosts:
        for key in ("cpu_percent", "memory_percent", "memory_used_gb"):
            history = client.get_metric_history(run.info.run_id, f"system/{host}/{key}")
            steps = sorted(m.step for m in history)
            assert steps == list(range(len(steps))), (host, key, steps)   # every sample once, in order
            assert all(m.value >= 0 for m in history) and (key != "memory_percent" or
                                                            all(0 < m.value <= 100 for m in history))
    assert len(client.get_metric_history(run.info.run_id, "epoch/val_acc")) == 3
