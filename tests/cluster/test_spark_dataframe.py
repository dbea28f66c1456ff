"""Spark DataFrames: hvdtrain.spark.fit(df=...) on a real local[2] Spark (the installed pyspark, 4.x by
default), 2 Horovod workers streaming their own row groups from the store; transform() into a DataFrame."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from support.spark_session import local_session, needs_java

import hvdtrain
import hvdtrain.spark
from hvdtrain.errors import UserError
from hvdtrain.spark.store import materialize

pytestmark = needs_java


@pytest.fixture(scope="module")
def spark():
    session = local_session("hvdtrain-dataframe-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def digits(spark):
    """The digits as 64 scalar pixel columns p0..p63, an int label and a row id (not a feature)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    bunch = load_digits()
    table = pd.DataFrame(bunch.data.astype(np.float32) / 16, columns=[f"p{i}" for i in range(64)])
    table["label"], table["id"] = bunch.target, np.arange(len(table))
    return spark.createDataFrame(table).repartition(4)


PIXELS = [f"p{i}" for i in range(64)]


def _store_files(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*") if p.is_file()) if store.exists() else []


@pytest.mark.parametrize("case, message", [
    ("missing", "column(s) nope not in the DataFrame (columns: p0, p1,"),
    ("text", "feature column word is string, not numeric"),
    ("text_label", "label column label is array<double>; use integer or string classes"),
    ("empty", "the DataFrame has no training rows (0 held out)"),
    ("one_row", "the DataFrame has 1 training row(s) for 2 worker(s)"),
    ("no_store", "fit(df=...) needs store=PATH"),
    ("bad_validation", "validation 1.5 must be a fraction in [0, 1) or a column name"),
])
def test_bad_dataframes_are_one_line_errors_and_leave_nothing_in_the_store(spark, digits, tmp_path, case, message):
    from pyspark.sql import functions as F

    df, features, labels = digits, PIXELS, ["label"]
    store: str | None = str(tmp_path / "store")
    validation: float | None = 0.2
    if case == "missing":
        features = ["p0", "nope"]
    elif case == "text":
        df, features = digits.withColumn("word", F.lit("seven")), ["p0", "word"]
    elif case == "text_label":
        df = digits.withColumn("label", F.array(F.lit(1.0)))
    elif case == "empty":
        df = digits.where("id < 0")
    elif case == "one_row":
        df, validation = digits.where("id = 3"), None
    elif case == "no_store":
        store = None
    elif case == "bad_validation":
        validation = 1.5
    with pytest.raises(UserError) as err:
        hvdtrain.spark.fit(None, df=df, feature_cols=features, label_cols=labels, validation=validation, store=store,
                           num_proc=2, model="mlp")
    assert str(err.value).startswith(message), err.value
    assert "\n" not in str(err.value)
    assert not (tmp_path / "store").exists(), _store_files(tmp_path / "store")


def test_the_same_dataframe_is_written_once_and_a_changed_one_again(spark, digits, tmp_path):
    store = str(tmp_path / "store")
    first = materialize(digits, store, PIXELS, ["label"], 0.2, partitions=8)
    assert not first.reused and first.train_rows + first.val_rows == 1797
    assert len(first.train_files) >= 8 and first.classes == list(range(10))
    written = {f: os.stat(f).st_mtime_ns for f in first.train_files}
    again = materialize(digits, store, PIXELS, ["label"], 0.2, partitions=8)
    assert again.reused and again.key == first.key and again.train_files == first.train_files
    assert {f: os.stat(f).st_mtime_ns for f in again.train_files} == written    # not rewritten
    other = materialize(digits.where("id % 2 = 0"), store, PIXELS, ["label"], 0.2)
    assert other.key != first.key and not other.reused and other.train_rows + other.val_rows == 899
    # A validation column instead of a fraction: exactly the marked rows are held out.
    marked = digits.withColumn("held_out", (digits.id % 5 == 0))
    by_column = materialize(marked, store, PIXELS, ["label"], "held_out", run_id="digits-v1")
    assert by_column.key.startswith("digits-v1-") and by_column.val_rows == 360 and by_column.train_rows == 1437
    for key in Path(store, "hvdtrain-data").iterdir():   # one attempt per key, named by its marker; no rename
        assert sorted(p.name for p in key.iterdir()) == sorted([json.loads((key / "_meta.json").read_text())["attempt"],
                                                                "_meta.json"]), key


def test_digits_dataframe_trains_on_two_workers_and_transform_matches_trainer_predict(spark, digits, tmp_path,
                                                                                      one_worker):
    result = hvdtrain.spark.fit(None, df=digits, feature_cols=PIXELS, label_cols=["label"], validation=0.2,
                                store=str(tmp_path / "store"), num_proc=2, model="mlp", epochs=8,
                                run_dir=str(tmp_path / "runs"), name="df")
    # A threshold: no cheap run reads the same rows in the same order; transform == predict below is exact.
    assert result.history[-1]["val_acc"] >= 0.95, result.history.table()
    assert result.history[-1]["val_samples"] == result.data.val_rows          # every held-out row, once
    assert len({r["digest"] for r in result.reports}) == 1 and len(result.reports) == 2   # equal final weights
    assert result.run_dir == str(tmp_path / "runs" / "df") and (tmp_path / "runs" / "df" / "model.pt").exists()

    predicted = result.transform(digits).select("id", "label", "prediction").toPandas().sort_values("id")
    assert len(predicted) == 1797 and predicted["id"].tolist() == list(range(1797))   # one row per input row
    assert (predicted["prediction"] == predicted["label"]).mean() >= 0.95

    # The same rows through the Trainer's own predict, in-process: the same classes for every row.
    rows = digits.orderBy("id").select(*PIXELS, "label").toPandas()
    data = torch.utils.data.TensorDataset(torch.tensor(rows[PIXELS].to_numpy(np.float32)),
                                          torch.tensor(rows["label"].to_numpy()))
    trainer = hvdtrain.Trainer(result.model, data, config=hvdtrain.load_config(run_dir="", epochs=1))
    expected = trainer.predict(data).argmax(dim=1)
    assert predicted["prediction"].tolist() == expected.tolist()

    with pytest.raises(UserError, match=r"^column\(s\) p5 the model was trained on are not in the DataFrame"):
        result.transform(digits.drop("p5"))


def test_a_dataframe_four_times_the_memory_budget_streams_each_ranks_row_groups(spark, tmp_path):
    """~200 MB of float32 arrays in >= 8 Parquet files; each rank reads about half the rows, one 2 MB row
    group at a time: its resident memory grows by less than a quarter of the data while it trains."""
    from pyspark.sql import functions as F

    width, rows = 256, 200_000
    df = spark.range(rows).select(F.array(*[F.rand(i).cast("float") for i in range(width)]).alias("x"),
                                  (F.col("id") % 2).alias("y"))
    result = hvdtrain.spark.fit(torch.nn.Linear(width, 2), df=df, feature_cols="x", label_cols="y", validation=0.02,
                                store=str(tmp_path / "store"), partitions=8, row_group_mb=2, num_proc=2,
                                epochs=1, batch_size=512, run_dir="")
    data = result.data
    dataset_bytes = sum(os.path.getsize(f) for f in [*data.train_files, *data.val_files])
    assert len(data.train_files) >= 8 and dataset_bytes > 180e6, (len(data.train_files), dataset_bytes)
    import pyarrow.parquet as pq

    groups = [g for f in data.train_files for g in
              [pq.ParquetFile(f).metadata.row_group(i).num_rows for i in range(pq.ParquetFile(f).num_row_groups)]]
    assert len(groups) >= 16
    block = -(-data.train_rows // 2)
    for report in result.reports:
        # Its block of rows, plus at most the two row groups its block starts and ends inside.
        assert block <= report["train_rows_read"] <= block + 2 * max(groups), (report, block, max(groups))
        assert 0 < report["peak_rss_growth"] < dataset_bytes / 4, (report, dataset_bytes)
    assert len({r["digest"] for r in result.reports}) == 1
    assert result.history[-1]["train_samples"] == 2 * block


def test_files_added_to_a_source_folder_are_new_data_not_a_stale_store(spark, digits, tmp_path):
    """A file scan's plan names the folder, not its files: the key must see the files (names, sizes, times)."""
    source, store = str(tmp_path / "source"), str(tmp_path / "store")
    digits.where("id < 900").write.parquet(source)
    first = materialize(spark.read.parquet(source), store, PIXELS, ["label"], 0.2)
    assert not first.reused and first.train_rows + first.val_rows == 900
    digits.where("id >= 900").write.mode("append").parquet(source)
    grown = materialize(spark.read.parquet(source), store, PIXELS, ["label"], 0.2)
    assert grown.key != first.key and not grown.reused and grown.train_rows + grown.val_rows == 1797
    again = materialize(spark.read.parquet(source), store, PIXELS, ["label"], 0.2)
    assert again.reused and again.key == grown.key
