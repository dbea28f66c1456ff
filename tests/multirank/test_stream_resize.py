"""A Parquet stream resumed mid-epoch on other numbers of workers, for real: 1 worker stops, 2 (horovodrun,
Gloo) go on and stop, 1 finishes the epoch; the model logs the indices each step trained, and every row
of the epoch is trained exactly once."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.paths import PLUGINS_DIR, ROOT
from support.processes import horovodrun, show

ROWS = 80     # training rows: 2 files of 40, row groups of 10; a third file is held out


@pytest.fixture
def shards(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for part in range(3):
        index = np.arange(part * 40, (part + 1) * 40, dtype=np.float32)
        columns = {f"f{i}": rng.normal(size=40).astype(np.float32) for i in range(4)}
        pq.write_table(pa.table({**columns, "index": index, "label": (index % 2).astype(np.int64)}),
                       tmp_path / f"part-{part}.parquet", row_group_size=10)
    return tmp_path


def trained_indices(log_prefix) -> list[int]:
    return [i for file in sorted(log_prefix.parent.glob(log_prefix.name + ".*"))
            for line in file.read_text().splitlines() for i in json.loads(line)["idx"]]


def test_a_stream_resumed_mid_epoch_on_other_workers_trains_every_row_once(tmp_path, shards):
    log = tmp_path / "probe"
    env = {"ELASTIC_PROBE_LOG": str(log), "ELASTIC_PROBE_SLEEP_S": "0", "PYTHONPATH": str(PLUGINS_DIR)}
    args = ["-m", "hvdtrain", "--dataset", f"shards:{shards / '*.parquet'}", "--features", "f0,f1,f2,f3,index",
            "--model", "elastic_probe:probe_mlp", "--val-fraction", "0.34", "--epochs", "1", "--batch-size", "4",
            "--threads", "1", "--checkpoint-epochs", "0", "--run-dir", str(tmp_path), "--name", "s"]

    def alone(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args, *more], cwd=ROOT, env=dict(os.environ, **env),
                              capture_output=True, text=True, timeout=300)

    first = alone("--max-steps", "5")                                          # rows 20 of 80, on 1 worker
    assert first.returncode == 0, show(first)
    pair = horovodrun(2, [*args, "--max-steps", "8", "--resume", "auto"], "gloo", env=env)   # 24 more, on 2
    assert pair.returncode == 0, show(pair)
    assert "with 2 workers instead of 1" in pair.stdout, show(pair)
    last = alone("--resume", "auto")                                           # the 36 left, on 1 again
    assert last.returncode == 0, show(last)
    assert "with 1 workers instead of 2" in last.stdout + last.stderr, show(last)
    assert sorted(trained_indices(log)) == list(range(ROWS))
