"""The quickstart's own-model script (examples/own_script/train.py) on two workers under horovodrun, as
the quickstart runs it: no Horovod call in the script, yet the workers split the data and end equal."""
from __future__ import annotations

import json
from pathlib import Path

from support.paths import ROOT
from support.processes import horovodrun, show


def test_the_own_script_trains_on_two_workers(tmp_path: Path) -> None:
    done = horovodrun(2, [str(ROOT / "examples/own_script/train.py"), "--epochs", "2", "--threads", "1",
                          "--name", "two"], "gloo", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, show(done)
    summary = json.loads((tmp_path / "runs" / "two" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["epochs_run"] == 2
    assert len(set(summary["param_digests"])) == 1, summary     # the replicas ended equal
    assert summary["train_samples"] == 2048                       # each sample once an epoch, across both
