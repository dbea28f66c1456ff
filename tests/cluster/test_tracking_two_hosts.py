"""One MLflow run with system metrics from both hosts of a two-host job. (Issue 27.)

Two real hosts in network namespaces with their own sshd and host names (netns_cluster.py); `hvdtrain launch`
(horovodrun, Gloo over ssh) starts one worker on each. Rank 0 on host1 holds the run in the embedded sqlite store;
host2's local rank 0 samples its CPU and memory, and the trainer gathers those samples to rank 0 at every epoch's
end. The trackers' credentials (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY) are set meanwhile, and no process's command
line on any host shows them (they travel the secrets file).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from support.netns_cluster import IFACE, SSH_PORT
from support.paths import ROOT
from support.processes import show
from test_credentials import CommandLineWatch
from test_two_hosts import cluster, write_hostfile  # noqa: F401 - cluster is the fixture

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hvdtrain.tracking import system  # noqa: E402

TRAIN = ["--dataset", "synthetic", "--synthetic-samples", "1280", "--synthetic-shape", "1,8,8", "--model", "mlp",
         "--hidden", "32", "--epochs", "3", "--threads", "1", "--log-interval", "5", "--tensorboard", "false"]


def test_one_run_holds_system_metrics_from_both_hosts(cluster, tmp_path):  # noqa: F811
    hostfile = write_hostfile(tmp_path)
    runs = tmp_path / "runs"
    launch = [sys.executable, "-m", "hvdtrain", "launch", "--secrets-dir", str(tmp_path / "secrets"), "-np", "2",
              "--hostfile", str(hostfile), "-p", str(SSH_PORT), "-i", str(cluster.key), "--network-interfaces", IFACE,
              "--start-timeout", "120", "--disable-cache", "--gloo", sys.executable, "-m", "hvdtrain", *TRAIN,
              "--run-dir", str(runs), "--name", "two", "--tracking", "mlflow"]
    # horovodrun forwards its environment to every worker: the sampling interval reaches host2's sampler too.
    token = f"hvdt-{secrets.token_hex(16)}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MLFLOW_TRACKING_TOKEN=token,
               WANDB_API_KEY=token, **{system.INTERVAL_ENV: "0.2"})
    env.pop("MLFLOW_TRACKING_URI", None)
    with CommandLineWatch(token) as watch:
        proc = subprocess.run(["ip", "netns", "exec", cluster.launcher.namespace, "unshare", "--uts", "sh", "-c",
                               'hostname launcher && exec "$0" "$@"', *launch],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert "warning" not in proc.stdout + proc.stderr, show(proc)
    assert not watch.leaks, watch.leaks
    assert any("python" in name for name in watch.namespaces.get(cluster.netns_id(cluster.workers[1]), ()))

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
