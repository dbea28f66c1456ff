"""The quickstart's last step, for real: your own script on two machines with `hvdtrain launch`.

examples/own_script/train.py (a plain script: a user model and dataset, hvdtrain.Trainer, no Horovod call)
is copied into an empty folder and started as the quickstart says, `hvdtrain launch -np 2 -H host1:1,host2:1
python train.py`, from a launcher namespace into two namespace hosts with their own sshd (netns_cluster.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from support.netns_cluster import IFACE, SSH_PORT
from support.paths import BIN, ROOT
from support.processes import show
from test_two_hosts import cluster  # noqa: F401 - the fixture


def test_the_own_script_trains_on_two_hosts_with_hvdtrain_launch(cluster, tmp_path):  # noqa: F811
    shutil.copy(ROOT / "examples/own_script/train.py", tmp_path / "train.py")
    launch = [str(BIN / "hvdtrain"), "launch", "-np", "2", "-H", "host1:1,host2:1",
              # the namespace hosts' own ssh port and key, and the bridge they share
              "-p", str(SSH_PORT), "-i", str(cluster.key), "--network-interfaces", IFACE,
              "--start-timeout", "120", "--disable-cache",
              sys.executable, "train.py", "--epochs", "2", "--threads", "1", "--name", "two-hosts"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.run(["ip", "netns", "exec", cluster.launcher.namespace, "unshare", "--uts", "sh", "-c",
                           'hostname launcher && exec "$0" "$@"', *launch],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    run = tmp_path / "runs" / "two-hosts"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["epochs_run"] == 2, summary
    assert len(set(summary["param_digests"])) == 1, summary        # both hosts' replicas ended equal
    # A threshold: the user's own example script has no reference run; that it trains is the quickstart's claim.
    assert summary["train_samples"] == 2048 and summary["val_acc"] > 0.8, summary
    assert (run / "model.pt").exists()
