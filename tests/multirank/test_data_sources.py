"""Real data without code, on 2 real workers: an image folder of PNGs with ResNet-18, a Parquet table,
and Parquet shards streamed across ranks x loader workers (each sample once per epoch, resumable)."""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from support.paths import PLUGINS_DIR
from support.processes import horovodrun, kill_tree, show

from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.data.sharding import steps_per_epoch

COMMON = ["--threads", "1", "--log-interval", "5"]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """PNGs of 3 classes (colour + noise) in ImageFolder layout, a digits table, digits as 10 shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for split, n in (("train", 70), ("val", 20)):
        for c, colour in enumerate([(190, 50, 50), (50, 190, 50), (50, 50, 190)]):
            folder = root / "images" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(rng.normal(0, 70, (24, 24, 3)) + colour, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    digits = load_digits()
    x, y = (digits.data / 16).astype(np.float32), digits.target
    pq.write_table(pa.table({**{f"p{i}": x[:, i] for i in range(64)}, "digit": y}), root / "digits.parquet")
    (root / "shards").mkdir()
    for s in range(10):
        rows = slice(s * 180, (s + 1) * 180)
        pq.write_table(pa.table({"pixels": pa.array(list(x[rows]), type=pa.list_(pa.float32())),
                                 "index": np.arange(len(y))[rows].astype(np.float32), "label": y[rows]}),
                       root / "shards" / f"part-{s:02d}.parquet", row_group_size=40)
    return root


TABLE_RUN = ["--model", "mlp", "--epochs", "2", *COMMON]
TABLE = ["--label", "digit"]   # and --dataset parquet:DATA/digits.parquet


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data) -> Path:
    """The image folder's run ("img") and the Parquet table's ("t"), one after the other in one job on 2 workers
    (tests/ranks/in_one_job.py): a launch costs more than the table's run does."""
    folder = tmp_path_factory.mktemp("runs")
    proc = horovodrun(2, ["tests/ranks/in_one_job.py",
                          "-m", "hvdtrain", "--dataset", f"images:{data / 'images'}", "--model", "resnet18",
                          "--image-size", "24", "--epochs", "3", "--batch-size", "16", "--lr", "0.02",
                          *COMMON, "--run-dir", str(folder), "--name", "img", "--",
                          "-m", "hvdtrain", *TABLE_RUN, "--dataset", f"parquet:{data / 'digits.parquet'}", *TABLE,
                          "--run-dir", str(folder), "--name", "t"], "gloo", timeout=600)   # two runs
    assert proc.returncode == 0, show(proc)
    return folder


def test_image_folder_with_resnet18_on_two_workers_beats_chance(runs):
    result = summary(runs / "img")
    # A threshold: no cheap reference run exists for ResNet-18 on PNGs; the claim is that it learns (chance is 1/3).
    assert result["val_samples"] == 60 and result["val_acc"] >= 0.6, result
    assert len(set(result["param_digests"])) == 1


def test_parquet_table_is_the_built_in_digits_and_trains_alike_on_two_workers(tmp_path, data, runs):
    """The table holds the built-in digits, so it must give the very same split (exact, not an accuracy bar)."""
    args = [*TABLE_RUN, "--run-dir", str(tmp_path)]
    table = ["--dataset", f"parquet:{data / 'digits.parquet'}", *TABLE]
    ours, builtin = (build_data(load_config(None, [*args, *dataset])) for dataset in (table, ["--dataset", "digits"]))
    assert ours.num_classes == builtin.num_classes == 10
    for mine, theirs in ((ours.train, builtin.train), (ours.val, builtin.val)):
        assert torch.equal(mine.tensors[0], theirs.tensors[0].flatten(1))
        assert torch.equal(mine.tensors[1], theirs.tensors[1])
    result = summary(runs / "t")   # the same arguments (TABLE_RUN, the table), trained by `runs`
    assert result["rank_steps"] == [2 * steps_per_epoch(len(builtin.train), 2, 32)] * 2, result
    assert result["val_samples"] == len(builtin.val) and len(set(result["param_digests"])) == 1, result


def steps_seen(log_prefix: Path) -> dict[tuple[str, int], list[int]]:
    """(rank, call) -> sample indices of the step that counted (the last one logged: a resumed run
    re-does the steps after its checkpoint, with the probe's counter restored with the weights)."""
    latest: dict[tuple[str, int], tuple[float, list[int]]] = {}
    for file in log_prefix.parent.glob(log_prefix.name + ".*"):
        for line in file.read_text().splitlines():
            record = json.loads(line)
            key = (record["rank"], record["call"])
            if key not in latest or record["t"] > latest[key][0]:
                latest[key] = (record["t"], record["idx"])
    return {key: idx for key, (_, idx) in latest.items()}


def test_streamed_shards_each_sample_once_equal_steps_and_exact_resume_after_kill(tmp_path, data, background):
    """2 ranks x 2 loader workers over 9 training shards (1 held out); kill -9 mid-epoch, --resume auto."""
    log = tmp_path / "probe"
    env = {"ELASTIC_PROBE_LOG": str(log), "ELASTIC_PROBE_SLEEP_S": "0.05", "PYTHONPATH": str(PLUGINS_DIR)}
    args = ["-m", "hvdtrain", "--dataset", f"shards:{data / 'shards' / '*.parquet'}", "--features", "pixels,index",
            "--model", "elastic_probe:probe_mlp", "--val-fraction", "0.1", "--epochs", "3", "--batch-size", "32",
            "--workers", "2", "--checkpoint-steps", "10", *COMMON, "--run-dir", str(tmp_path), "--name", "s"]
    first = background(2, args, "gloo", tmp_path / "first.log", env=env)
    checkpoints = tmp_path / "s" / "checkpoints"
    deadline = time.time() + 240
    while not (checkpoints / "ckpt-000000040.pt").exists():  # epoch 2 (26 steps each), mid-epoch
        assert first.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    kill_tree(first, 9)
    proc = horovodrun(2, [*args, "--resume", "auto"], "gloo", env=env)
    assert proc.returncode == 0, show(proc)
    assert "resum" in proc.stdout
    result = summary(tmp_path / "s")
    steps_per_epoch = 26  # ceil(ceil(1620 / 2) / 32)
    assert result["rank_steps"] == [3 * steps_per_epoch] * 2
    seen = steps_seen(log)
    assert {rank for rank, _ in seen} == {"0", "1"}
    train_ids = sorted(range(1620))  # the first 9 shards: rows 0..1619
    for epoch in range(3):
        calls = range(epoch * steps_per_epoch + 1, (epoch + 1) * steps_per_epoch + 1)
        ids = sorted(i for rank in ("0", "1") for call in calls for i in seen[(rank, call)])
        assert ids == train_ids, f"epoch {epoch + 1}: {len(ids)} samples, {len(set(ids))} distinct"
    by_rank: dict[str, int] = defaultdict(int)
    for rank, _ in seen:
        by_rank[rank] += 1
    assert by_rank["0"] == by_rank["1"] == 3 * steps_per_epoch
