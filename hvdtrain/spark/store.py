"""The store: a DataFrame materialised once as Parquet, where every rank can stream its row groups.

Layout under the store (a local or shared path, or a URL pyarrow/fsspec can open: hdfs://, s3://):

    STORE/hvdtrain-data/KEY/attempt-ID/__hvdtrain_val=false/...parquet   the training rows
    STORE/hvdtrain-data/KEY/attempt-ID/__hvdtrain_val=true/...parquet    the held-out rows (if asked for)
    STORE/hvdtrain-data/KEY/_meta.json     the marker: names attempt-ID, its files, columns, classes,
                                           row counts; written last, in one put

KEY is a digest (after the run_id, when given) of the DataFrame's plan (Spark's semanticHash), its
schema, its input files (path, size, modification time), the chosen columns and the validation split:
the same DataFrame over the same files fitted again reuses the files, a changed one is written anew.

Nothing is ever renamed: object stores (S3, GCS) cannot rename a folder. Each write goes into a new
attempt-ID folder under KEY and is trusted only once `_meta.json` names it; readers read only the
attempt it names. A crashed write leaves an attempt no marker names: the next fit writes a fresh one
beside it, and attempts the marker does not name are removed (best effort) once a marker exists. An
error (bad column, too few rows) removes the attempt, so the store never holds a half-written dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from hvdtrain.errors import UserError, first_line
from hvdtrain.spark.layout import FOLDER, MARKER, VAL_FLAG
from hvdtrain.spark.store_keys import ensure_key, fields, read_key

__all__ = ["FOLDER", "MARKER", "VAL_FLAG", "ensure_key", "read_key"]


@dataclass(frozen=True)
class Materialized:
    """What the workers need to stream a materialised DataFrame."""
    store: str                  # the store URL/path as given
    key: str
    train_files: list[str]      # paths on the store's filesystem
    val_files: list[str]
    feature_cols: list[str]
    label_cols: list[str]
    classes: list[Any] | None   # None: regression
    train_rows: int
    val_rows: int
    reused: bool = False

    @property
    def num_outputs(self) -> int:
        return len(self.classes) if self.classes is not None else len(self.label_cols)

    def filesystem(self) -> Any:
        return filesystem_of(self.store)[0]


def filesystem_of(store: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path on it) for a local path or a URL; fsspec's where pyarrow has none."""
    import pyarrow.fs as pafs

    if "://" not in store:
        return pafs.LocalFileSystem(), os.path.abspath(store)
    url = re.sub(r"^s3a://", "s3://", store)    # Spark's Hadoop name for S3; pyarrow calls it s3
    try:
        return pafs.FileSystem.from_uri(url)
    except Exception as arrow_err:  # pyarrow built without this filesystem: try fsspec's
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(url)
            return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path
        except Exception:
            raise UserError(f"cannot open store {store}: {first_line(arrow_err, 160)}; use a local or "
                            "shared path, or install the filesystem's package (e.g. s3fs, gcsfs)") from None


def spark_url(store: str, path: str) -> str:
    """`path` (on the store's filesystem) as Spark's writers name it."""
    if "://" not in store:
        return "file://" + path
    scheme = store.split("://", 1)[0]
    scheme = "s3a" if scheme == "s3" else scheme
    return f"{scheme}://{path}" if not path.startswith(f"{scheme}://") else path


def check_columns(schema: Any, feature_cols: list[str], label_cols: list[str], validation: Any) -> None:
    """One-line UserErrors for columns that are missing or not numbers, before anything runs."""
    from pyspark.sql import types as T

    if not feature_cols:
        raise UserError("feature_cols is empty; name the DataFrame's feature columns, e.g. feature_cols=['features']")
    if not label_cols:
        raise UserError("label_cols is empty; name the label column, e.g. label_cols=['label']")
    fields = {f.name: f.dataType for f in schema.fields}
    wanted = [*feature_cols, *label_cols] + ([validation] if isinstance(validation, str) else [])
    missing = [c for c in wanted if c not in fields]
    if missing:
        raise UserError(f"column(s) {', '.join(missing)} not in the DataFrame (columns: {', '.join(fields)})")
    overlap = sorted(set(feature_cols) & set(label_cols))
    if overlap:
        raise UserError(f"column(s) {', '.join(overlap)} are both features and labels; leave them out of feature_cols")
    numeric = (T.NumericType, T.BooleanType)
    for name in feature_cols:
        kind = fields[name]
        element = kind.elementType if isinstance(kind, T.ArrayType) else kind
        if not (isinstance(element, numeric) or _is_vector(kind)):
            raise UserError(f"feature column {name} is {kind.simpleString()}, not numeric (numbers, arrays of "
                            "numbers or ML vectors); encode it as numbers or leave it out of feature_cols")
    for name in label_cols:
        if not isinstance(fields[name], (*numeric, T.StringType)):
            raise UserError(f"label column {name} is {fields[name].simpleString()}; use integer or string classes, "
                            "or floats for regression")
    if isinstance(validation, str) and not isinstance(fields[validation], (T.BooleanType, T.IntegralType)):
        raise UserError(f"validation column {validation} is {fields[validation].simpleString()}; it must be "
                        "boolean (true = held out) or 0/1")


def _is_vector(kind: Any) -> bool:
    return type(kind).__name__ == "VectorUDT"


def data_key(df: Any, feature_cols: list[str], label_cols: list[str], validation: Any, seed: int,
             run_id: str | None) -> str:
    """The store folder's name: a digest of what the data is and of every choice that shapes what is written.

    A file scan's plan names its folder, not the files in it, so the files themselves (path, size,
    modification time) are part of the digest: files added or rewritten give a new key, never a stale
    reuse. With run_id the key is RUN_ID-DIGEST: a readable name that still changes with those choices.
    """
    if run_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", run_id):
        raise UserError(f"run_id {run_id!r} must be 1-100 letters, digits, '.', '_' or '-'")
    plan = [df.semanticHash(), df.schema.json(), source_files(df.inputFiles()), feature_cols, label_cols,
            repr(validation), seed]
    digest = hashlib.sha256(json.dumps(plan, default=str).encode()).hexdigest()[:16]
    return f"{run_id}-{digest}" if run_id else f"df-{digest}"


def source_files(paths: list[str]) -> list[tuple[str, int, int]]:
    """(path, size, mtime in ns) of each input file, sorted; size and mtime -1 where it cannot be stat'ed here."""
    listing = []
    for path in sorted(paths):
        local = path[len("file:"):] if path.startswith("file:") else path
        try:
            info = os.stat(local)
            listing.append((path, info.st_size, info.st_mtime_ns))
        except OSError:
            listing.append((path, -1, -1))  # a remote URL: its name still marks files added or removed
    return listing


def materialize(df: Any, store: str, feature_cols: list[str], label_cols: list[str], validation: float | str | None,
                *, seed: int = 42, run_id: str | None = None, min_rows: int = 1, partitions: int | None = None,
                row_group_mb: int = 8) -> Materialized:
    """Write the DataFrame's chosen columns to the store once (or find them there); see the module doc.

    Args:
        validation: a fraction of rows held out (rand(seed) < fraction), a boolean column naming them, or
            None/0 for none.
        min_rows: fewer training rows than this (the number of workers) is an error.
        partitions: repartition to this many files first (None: one file per DataFrame partition).
        row_group_mb: Parquet row group size: the unit a worker holds in memory.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    check_columns(df.schema, feature_cols, label_cols, validation)
    if row_group_mb < 1:
        raise UserError(f"row_group_mb must be >= 1, got {row_group_mb}")
    if isinstance(validation, (int, float)) and not isinstance(validation, bool) and not 0 <= validation < 1:
        raise UserError(f"validation {validation} must be a fraction in [0, 1) or a column name")
    fs, root = filesystem_of(store)
    key = data_key(df, feature_cols, label_cols, validation, seed, run_id)
    columns = [vector_to_array(F.col(c)).alias(c) if _is_vector(df.schema[c].dataType) else F.col(c)
               for c in [*feature_cols, *label_cols]]
    if isinstance(validation, str):
        flag = F.col(validation).cast("boolean")
    else:
        flag = F.rand(seed) < F.lit(float(validation or 0))
    out = df.select(*columns, flag.alias(VAL_FLAG))     # lazy: no Spark job unless ensure_key writes
    if partitions:
        out = out.repartition(partitions)
    meta, reused = ensure_key(fs, root, key, partial(_spark_write, out, store, row_group_mb),
                              feature_cols, label_cols, validation, min_rows=min_rows)
    return Materialized(store=store, key=key, reused=reused, **fields(meta))


def _spark_write(out: Any, store: str, row_group_mb: int, path: str) -> None:
    (out.write.mode("errorifexists").partitionBy(VAL_FLAG)
     .option("parquet.block.size", str(row_group_mb << 20))
     .parquet(spark_url(store, path)))


