"""Tier 1: datasets and how they split across ranks, with rank and size as plain arguments."""
from __future__ import annotations

import pytest
import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.datasets import build_data, digits, synthetic
from hvdtrain.data.sharding import ShardSampler, check_fits, eval_shard, steps_per_epoch
from hvdtrain.errors import UserError


def test_digits_is_real_and_held_out_disjointly():
    data = digits(TrainConfig())
    assert len(data.train) + len(data.val) == 1797
    assert len(data.val) == round(1797 * 0.2)
    assert data.train[0][0].shape == (1, 8, 8) and data.num_classes == 10
    train_x = {tuple(x.flatten().tolist()) for x, _ in data.train}
    overlap = sum(tuple(x.flatten().tolist()) in train_x for x, _ in data.val)
    assert overlap < 10  # digits has a few duplicate images; a shared split would give 359


def test_synthetic_has_the_asked_size_and_shape_and_is_deterministic():
    config = TrainConfig(dataset="synthetic", synthetic_samples=100, synthetic_shape=(3, 5, 5),
                         num_classes=4, val_fraction=0.1)
    a, b = synthetic(config), synthetic(config)
    assert len(a.train) == 90 and len(a.val) == 10 and a.num_classes == 4
    assert a.train[0][0].shape == (3, 5, 5)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert set(a.train.tensors[1].tolist()) <= set(range(4))


@pytest.mark.parametrize("n, size", [(1001, 2), (1001, 3), (10, 4), (7, 7)])
def test_eval_shards_cover_every_sample_exactly_once(n, size):
    seen = sorted(i for rank in range(size) for i in eval_shard(n, rank, size))
    assert seen == list(range(n))


@pytest.mark.parametrize("n, size, batch", [(1001, 2, 32), (1001, 3, 32), (1001, 3, 7), (5, 2, 1)])
def test_every_rank_runs_the_same_number_of_steps(n, size, batch):
    """hvdtrain's ShardSampler pads shards to equal length, so no rank waits in a lone allreduce (that it
    matches torch's DistributedSampler is tested in test_checkpoint.py)."""
    counts = set()
    for rank in range(size):
        sampler = ShardSampler(n, rank, size, seed=0)
        sampler.set_epoch(3, start=0)
        shard = list(sampler)
        assert len(shard) == len(sampler)
        counts.add(-(-len(shard) // batch))
    assert counts == {steps_per_epoch(n, size, batch)}


def test_dataset_smaller_than_world_is_refused():
    check_fits(2, 2)
    with pytest.raises(UserError, match="1 samples, fewer than the 2 workers"):
        check_fits(1, 2)


def test_plugin_dataset_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "mydata.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def build(config):\n"
        "    x = torch.zeros(6, 3); y = torch.tensor([0, 1, 0, 1, 0, 1])\n"
        "    return TensorDataset(x[:4], y[:4]), TensorDataset(x[4:], y[4:]), 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = build_data(TrainConfig(dataset="mydata:build"))
    assert len(data.train) == 4 and len(data.val) == 2 and data.num_classes == 2


@pytest.mark.parametrize("spec, message", [
    ("imagenet", "unknown dataset 'imagenet'; choose one of digits, synthetic or a plug-in"),
    ("no_such_pkg.data:build", "cannot import module 'no_such_pkg.data' for --dataset"),
    ("json:nothing_here", "module 'json' has no function 'nothing_here'"),
])
def test_bad_dataset_specs(spec, message):
    with pytest.raises(UserError) as err:
        build_data(TrainConfig(dataset=spec))
    assert message in str(err.value)


def _sorted_table(tmp_path, files: int = 3, rows: int = 40, group: int = 10) -> list[str]:
    """Rows 0..files*rows-1 in order (label = row id % 2), `group` rows per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for f in range(files):
        ids = list(range(f * rows, (f + 1) * rows))
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"x": [float(i) for i in ids], "v": [[float(i), -1.0] for i in ids],
                                 "y": [i % 2 for i in ids]}), path, row_group_size=group)
        paths.append(str(path))
    return paths


def test_a_stream_gives_each_rank_its_rows_once_shuffled_inside_groups_and_reads_only_its_groups(tmp_path):
    from hvdtrain.data.streaming import ParquetStream

    files = _sorted_table(tmp_path)
    seen = []
    for rank in (0, 1):
        stream = ParquetStream(files, "x,v", "y", [0, 1], batch_size=8, seed=3)
        stream.reshard(rank, 2)
        rows = [int(x[0].item()) for x, _ in stream]
        assert len(rows) == 60 and stream.rows_read <= 60 + 2 * 10   # its block, plus two boundary groups
        assert all(x.tolist() == [x[0].item(), x[0].item(), -1.0] for x, _ in stream)   # scalar, then the array
        seen += rows
    assert sorted(seen) == list(range(120))                          # every row once across ranks
    # A sorted table still mixes: inside each group of 10 the order is not ascending.
    assert any(seen[i:i + 10] != sorted(seen[i:i + 10]) for i in range(0, 120, 10))


def test_a_parquet_table_reads_each_group_once_in_strided_order_and_takes_several_float_labels(tmp_path):
    from hvdtrain.data.streaming import ParquetTable

    files = _sorted_table(tmp_path)
    table = ParquetTable(files, ["v"], "y", [0, 1])
    assert len(table) == 120 and table[57][0].tolist() == [57.0, -1.0] and table[57][1].item() == 1
    strided = ParquetTable(files, ["v"], "y", [0, 1])
    assert [int(strided[i][0][0]) for i in range(1, 120, 2)] == list(range(1, 120, 2))
    assert strided.rows_read == 120                                  # 12 groups, each loaded once
    regression = ParquetTable(files, ["v"], ["x", "x"], None)
    with pytest.raises(UserError, match="label columns y are not floats"):
        ParquetTable(files, ["v"], ["x", "y"], None)[0]
    assert regression[5][1].tolist() == [5.0, 5.0]
