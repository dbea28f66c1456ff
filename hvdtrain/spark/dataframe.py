"""Train on a Spark DataFrame and predict into one (the estimator Horovod's TorchEstimator was, without
Petastorm, so it runs on Spark 4 and pyarrow >= 15).

fit: the DataFrame's feature/label columns are written once to the store as Parquet (store.py); each
of the N Horovod workers (Spark tasks) streams its own row groups with pyarrow (ParquetStream: per-rank
blocks, shuffled per epoch, equal steps), so a rank holds one row group at a time, never the dataset.
The held-out rows are read the same way (ParquetTable). transform: mapInArrow, the model unpickled
once per task, predictions computed in batches.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.output.history import History
from hvdtrain.output.plain_weights import load_plain_state, plain_state_dict
from hvdtrain.spark.store import Materialized, materialize


@dataclass
class DataFrameJob:
    """What every worker receives (pickled): the data's whereabouts and how to train."""
    data: Materialized
    config: TrainConfig
    model: nn.Module | None      # None: build config.model for the data's shape
    loss_fn: Any = None
    metrics: Sequence[Any] | None = None


def train_on_store(job: DataFrameJob) -> dict[str, Any]:
    """Runs on every rank: stream this rank's rows, train, and report what was read."""
    from hvdtrain.data.streaming import ParquetStream, ParquetTable
    from hvdtrain.distributed import runtime
    from hvdtrain.train.evaluation import param_digest
    from hvdtrain.train.trainer import Trainer

    config, data = job.config, job.data
    torch.manual_seed(config.seed)
    fs = data.filesystem()
    labels = data.label_cols
    train = ParquetStream(data.train_files, data.feature_cols, labels, data.classes, config.batch_size, config.seed,
                          filesystem=fs)
    val = ParquetTable(data.val_files, train.features, labels, data.classes, filesystem=fs) if data.val_files \
        else None
    width = _width(train)
    model = job.model if job.model is not None else build_model(config, (width,), data.num_outputs)
    trainer = Trainer(model, train, val, config=config, loss_fn=job.loss_fn, metrics=job.metrics)
    train.rows_read = 0     # count what training reads, not the first-batch probes
    _reset_peak_rss()
    with trainer:           # gives the run folder back
        history = trainer.fit()
    world = runtime.world()
    report = {"rank": world.rank, "input_width": width, "train_rows_read": train.rows_read,
              "val_rows_read": val.rows_read if val else 0, "digest": param_digest(trainer.model),
              "peak_rss_growth": _peak_rss_growth()}
    if world.rank == 0:
        report["history"] = history
        report["state"] = {k: v.detach().cpu() for k, v in plain_state_dict(trainer.model).items()}  # --compile too
    return report


def _width(stream: Any) -> int:
    features, _ = next(iter(stream))
    return int(features.numel())


_rss_at_reset = 0


def _reset_peak_rss() -> None:
    """Start the peak-RSS count now (Linux: writing 5 to clear_refs resets VmHWM), so the peak seen
    after training is what training and its data took, not the imports before it."""
    global _rss_at_reset
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _rss_at_reset = _status_kb("VmRSS")
    except OSError:
        _rss_at_reset = -1


def _peak_rss_growth() -> int:
    """Bytes the resident set grew above its size at the reset, at its peak; -1 where unknown."""
    if _rss_at_reset < 0:
        return -1
    return (_status_kb("VmHWM") - _rss_at_reset) * 1024


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


@dataclass
class SparkModel:
    """A model trained on a DataFrame: `transform(df)` adds a prediction column.

    Attributes:
        model: the trained torch module (rank 0's weights; all ranks hold the same).
        history: per-epoch metrics and `.summary` (incl. run_dir), as `hvdtrain.fit` returns.
        data: where the training data was materialised (store, key, files, classes).
        reports: each rank's report (rows read, weight digest, peak memory growth).
    """
    model: nn.Module
    history: History
    data: Materialized
    reports: list[dict[str, Any]]

    @property
    def run_dir(self) -> str | None:
        return self.history.summary.get("run_dir")

    def transform(self, df: Any, output_col: str = "prediction", batch_size: int = 1024) -> Any:
        """df plus `output_col`: the class (same values as the label) for classification, the predicted
        value (or array, for several label columns) for regression. Lazy, like every Spark transform."""
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        _check_features(df.schema, self.data.feature_cols)
        if output_col in df.columns:
            raise UserError(f"the DataFrame already has a column {output_col}; pass output_col='...' to name the "
                            "prediction another way")
        vectors = [c for c in self.data.feature_cols if type(df.schema[c].dataType).__name__ == "VectorUDT"]
        inputs = df.select("*", *[vector_to_array(F.col(c)).alias(f"__hvdtrain_{c}") for c in vectors])
        features = [f"__hvdtrain_{c}" if c in vectors else c for c in self.data.feature_cols]
        spark = df.sparkSession
        payload = spark.sparkContext.broadcast(cloudpickle.dumps((self.model, features, self.data.classes)))
        # A new StructType: .add() would change the DataFrame's own cached schema in place.
        schema = T.StructType([*inputs.schema.fields, T.StructField(output_col, _output_type(self.data))])
        return (inputs.mapInArrow(_predictor(payload, output_col, batch_size), schema)
                .drop(*[f"__hvdtrain_{c}" for c in vectors]).select(*df.columns, F.col(output_col)))


def _check_features(schema: Any, feature_cols: list[str]) -> None:
    fields = {f.name for f in schema.fields}
    missing = [c for c in feature_cols if c not in fields]
    if missing:
        raise UserError(f"column(s) {', '.join(missing)} the model was trained on are not in the DataFrame "
                        f"(columns: {', '.join(fields)})")


def _output_type(data: Materialized) -> Any:
    from pyspark.sql import types as T

    if data.classes is None:
        return T.DoubleType() if len(data.label_cols) == 1 else T.ArrayType(T.DoubleType())
    if all(isinstance(c, bool) for c in data.classes):
        return T.BooleanType()
    return T.StringType() if any(isinstance(c, str) for c in data.classes) else T.LongType()


def _predictor(payload: Any, output_col: str, batch_size: int) -> Any:
    def predict_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from hvdtrain.data.tabular import features_of
        from hvdtrain.train.batch import first_tensor

        model, features, classes = cloudpickle.loads(payload.value)   # once per task, not per batch
        model.eval()
        torch.set_num_threads(_task_cpus())
        for batch in batches:
            inputs = torch.from_numpy(features_of(pa.Table.from_batches([batch]), features))
            outputs = []
            with torch.no_grad():
                for start in range(0, len(inputs), batch_size):
                    output = first_tensor(model(inputs[start:start + batch_size]))
                    if output is None:
                        raise UserError("the model returned no tensor; transform needs a tensor of outputs")
                    outputs.append(output.float())
            out = torch.cat(outputs) if outputs else torch.empty(0, 1)
            if classes is not None:
                values: Any = [classes[i] for i in out.argmax(dim=1).tolist()]
            elif out.dim() == 2 and out.shape[1] == 1:
                values = out[:, 0].double().tolist()
            else:
                values = out.double().tolist()
            yield batch.append_column(output_col, pa.array(values))

    return predict_partition


def _task_cpus() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return max(1, context.cpus()) if context is not None else 1


def fit_dataframe(model_or_config: Any, df: Any, *, feature_cols: Sequence[str] | str,
                  label_cols: Sequence[str] | str, validation: float | str | None, store: str | None,
                  num_proc: int, run_id: str | None, partitions: int | None, row_group_mb: int, loss_fn: Any,
                  metrics: Any, launch: Any, overrides: dict[str, Any]) -> SparkModel:
    """See hvdtrain.spark.fit (df=...)."""
    feature_cols = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
    label_cols = [label_cols] if isinstance(label_cols, str) else list(label_cols)
    if isinstance(model_or_config, TrainConfig):
        config, model = dataclasses.replace(model_or_config, **overrides) if overrides else model_or_config, None
    elif isinstance(model_or_config, nn.Module) or model_or_config is None:
        config, model = load_config(**overrides), model_or_config
    else:
        raise UserError(f"with df=..., the first argument is a torch.nn.Module or a TrainConfig, got "
                        f"{type(model_or_config).__name__}")
    if store is None:
        raise UserError("fit(df=...) needs store=PATH: a local or shared folder (or hdfs://, s3://...) where the "
                        "DataFrame is written once as Parquet for the workers to stream")
    data = materialize(df, store, feature_cols, label_cols, validation, seed=config.seed, run_id=run_id,
                       min_rows=num_proc, partitions=partitions, row_group_mb=row_group_mb)
    print(f"hvdtrain: {'reusing' if data.reused else 'wrote'} {data.train_rows} training + {data.val_rows} "
          f"held-out rows in {len(data.train_files) + len(data.val_files)} Parquet file(s) at "
          f"{os.path.join(store, 'hvdtrain-data', data.key)}", flush=True)
    reports = launch(train_on_store, DataFrameJob(data, config, model, loss_fn, metrics))
    root = next(r for r in reports if r["rank"] == 0)
    trained = copy.deepcopy(model) if model is not None else build_model(config, (root["input_width"],),
                                                                           data.num_outputs)
    load_plain_state(trained, root["state"])    # the user's model may be a compiled one
    return SparkModel(trained.eval(), root["history"], data, [{k: v for k, v in r.items() if k not in (
        "history", "state")} for r in reports])

