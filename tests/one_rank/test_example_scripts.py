"""The scripts the docs tell a newcomer to copy run as written (issue 41): the quickstart's own-model script
(examples/own_script/train.py) and the migration guide's "before" and "after" scripts (examples/migrate/), each
on one worker in an empty folder. The own script on two workers and on two hosts: tests/multirank and
tests/cluster/test_own_script_two_hosts.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT
from support.processes import show
from support.runs import records

OWN = ROOT / "examples" / "own_script" / "train.py"
MIGRATE = ROOT / "examples" / "migrate"
ENV = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONPATH=str(ROOT))


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def epochs(run_dir: Path) -> list[dict]:
    return records(run_dir, "epoch")


def undocumented(keys: set[str]) -> set[str]:
    """Fields of metrics.jsonl that docs/reference/run-folder.md does not describe."""
    page = (ROOT / "docs/reference/run-folder.md").read_text()
    metric = re.compile(r"(train_|val_)?(loss|acc|top\d+_acc|mse|mae)")   # `<metric>`, `train_<metric>`, ...
    return {key for key in keys if f"`{key}`" not in page and not metric.fullmatch(key)}


def test_the_own_script_trains_on_one_worker_and_takes_config_keys(tmp_path: Path) -> None:
    done = run([sys.executable, str(OWN), "--epochs", "2", "--threads", "1", "--name", "one"], tmp_path)
    assert done.returncode == 0, show(done)
    assert "hvdtrain: done  1 worker(s)  2 epochs" in done.stdout + done.stderr, show(done)
    per_epoch = epochs(tmp_path / "runs" / "one")
    assert [r["epoch"] for r in per_epoch] == [0, 1]   # metrics.jsonl counts from 0, the console from 1
    assert per_epoch[-1]["val_acc"] > 0.8
    assert (tmp_path / "runs" / "one" / "model.pt").exists()
    written = records(tmp_path / "runs" / "one")
    assert {r["kind"] for r in written} == {"train", "epoch", "summary"}
    assert not undocumented({key for r in written for key in r}), "describe them in docs/reference/run-folder.md"


@pytest.mark.parametrize("before", ["train_horovod.py", "train_ddp.py", "train_plain.py"])
def test_a_migration_before_script_runs(before: str, tmp_path: Path) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"] if "ddp" in before else \
        [sys.executable]
    done = run([*launcher, str(MIGRATE / before)], tmp_path)
    assert done.returncode == 0, show(done)
    assert "epoch 2 loss" in done.stdout and (tmp_path / "model.pt").exists(), show(done)


def test_the_migration_after_script_trains(tmp_path: Path) -> None:
    done = run([sys.executable, str(MIGRATE / "train_hvdtrain.py"), "--threads", "1", "--name", "after"], tmp_path)
    assert done.returncode == 0, show(done)
    per_epoch = epochs(tmp_path / "runs" / "after")
    assert len(per_epoch) == 3 and per_epoch[-1]["train_acc"] > 0.8, per_epoch


def test_the_own_loop_after_script_trains_and_a_second_run_resumes_after_its_last_epoch(tmp_path: Path) -> None:
    """hvdtrain.prepare keeps the loop; its checkpoint says the 3 epochs are done, so running it again trains none."""
    done = run([sys.executable, str(MIGRATE / "train_own_loop.py")], tmp_path)
    assert done.returncode == 0 and "epoch 2 loss" in done.stdout and (tmp_path / "ckpt.pt").exists(), show(done)
    again = run([sys.executable, str(MIGRATE / "train_own_loop.py")], tmp_path)
    assert again.returncode == 0 and "hvdtrain: lr 0.05 -> 0.05" in again.stdout, show(again)
    assert "epoch" not in again.stdout, show(again)
