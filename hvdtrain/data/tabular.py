"""Tabular data (CSV or Parquet) as tensors: feature and label columns chosen by name.

Features are numeric scalar columns, or one list/array column per sample (e.g. an image flattened
into a vector); they become one float32 vector per row. The label column decides the task: integer
or string labels are classes (strings are numbered in sorted order), floating-point labels are a
regression target (then the model has one output and the loss is MSE).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hvdtrain.errors import UserError, first_line


def read_table(path: str) -> Any:
    """A pyarrow Table from a .csv / .parquet file or a folder of Parquet files."""
    import pyarrow.csv
    import pyarrow.dataset as ds

    source = Path(path)
    if not source.exists():
        raise UserError(f"data file {path} does not exist")
    try:
        if source.suffix.lower() == ".csv":
            return pyarrow.csv.read_csv(source)
        return ds.dataset(source, format="parquet").to_table()
    except Exception as err:  # pyarrow's errors: not a CSV / Parquet file, unreadable
        raise UserError(f"cannot read {path} as {'CSV' if source.suffix.lower() == '.csv' else 'Parquet'}: "
                        f"{first_line(err)}") from None


def feature_names(schema_names: list[str], features: str, label: str) -> list[str]:
    """`--features a,b,c`, or every column but the label when empty; each must exist."""
    names = [n.strip() for n in features.split(",") if n.strip()] or [n for n in schema_names if n != label]
    missing = [n for n in [*names, label] if n not in schema_names]
    if missing:
        raise UserError(f"column(s) {', '.join(missing)} not in the data (columns: {', '.join(schema_names)}); "
                        "check --features / --label")
    if label in names:
        raise UserError(f"column {label} is the label; leave it out of --features")
    return names


def features_of(table: Any, names: list[str]) -> np.ndarray:
    """[rows, features] float32 from numeric scalar columns and/or list/array columns."""
    import pyarrow.types as pat

    parts = []
    for name in names:
        column = table.column(name).combine_chunks() if table.num_rows else table.column(name)
        kind = column.type
        if pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind):
            if not (pat.is_integer(kind.value_type) or pat.is_floating(kind.value_type)):
                raise UserError(f"feature column {name} holds lists of {kind.value_type}, not numbers")
            parts.append(_array_column(name, column))
        elif pat.is_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind):
            if column.null_count:
                raise UserError(f"feature column {name} has {column.null_count} missing value(s); fill or drop them")
            parts.append(column.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, 1))
        else:
            raise UserError(f"feature column {name} is not numeric ({kind}); encode it as numbers or leave it "
                            "out of --features")
    if not parts:
        return np.zeros((table.num_rows, 0), dtype=np.float32)
    return np.concatenate(parts, axis=1)


def _array_column(name: str, column: Any) -> np.ndarray:
    """[rows, width] float32 from a list column whose rows all hold `width` numbers (no Python lists)."""
    import pyarrow.compute as pc

    if not len(column):
        return np.zeros((0, 0), dtype=np.float32)
    lengths = pc.list_value_length(column)
    if column.null_count or pc.min_max(lengths)["min"] != pc.min_max(lengths)["max"]:
        raise UserError(f"feature column {name} holds arrays of different lengths (or nulls); "
                        "every row needs the same length")
    values = pc.list_flatten(column)
    if values.null_count:
        raise UserError(f"feature column {name} has missing values inside its arrays; fill or drop them")
    flat = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(len(column), -1)


def targets_of(table: Any, labels: list[str], classes: list[Any] | None = None) -> tuple[
        torch.Tensor, list[Any] | None]:
    """One label column as for labels_of; several must all be floats: a [rows, k] regression target."""
    if len(labels) == 1:
        return labels_of(table, labels[0], classes)
    import pyarrow.types as pat

    not_float = [n for n in labels if not pat.is_floating(table.column(n).type)]
    if not_float:
        raise UserError(f"label columns {', '.join(not_float)} are not floats; several label columns form one "
                        "regression target, so each must be floating point (or pass one class column)")
    return torch.stack([labels_of(table, n)[0] for n in labels], dim=1), None


def labels_of(table: Any, label: str, classes: list[Any] | None = None) -> tuple[torch.Tensor, list[Any] | None]:
    """Targets, and the class list (None for a regression target). `classes` reuses a training set's list."""
    import pyarrow.types as pat

    column = table.column(label)
    if column.null_count:
        raise UserError(f"label column {label} has {column.null_count} missing value(s)")
    values = column.to_numpy(zero_copy_only=False) if table.num_rows else np.array([])
    if pat.is_floating(column.type):
        return torch.as_tensor(values.astype(np.float32)), None
    if not (pat.is_integer(column.type) or pat.is_string(column.type) or pat.is_large_string(column.type)
            or pat.is_boolean(column.type)):
        raise UserError(f"label column {label} is {column.type}; use integer or string classes, or floats")
    classes = classes if classes is not None else sorted(set(values.tolist()))
    index = {value: i for i, value in enumerate(classes)}
    unknown = sorted({v for v in values.tolist() if v not in index}, key=str)
    if unknown:
        raise UserError(f"label column {label} has classes {unknown[:5]} that the training data does not")
    return torch.tensor([index[v] for v in values.tolist()], dtype=torch.long), classes


def tabular(path: str, features: str, label: str, val_fraction: float, seed: int) -> tuple[Any, Any, int]:
    """(train, val, num_classes; 1 for regression) from one table, split by val_fraction with `seed`."""
    from torch.utils.data import TensorDataset

    table = read_table(path)
    if table.num_rows < 2:
        raise UserError(f"{path} has {table.num_rows} row(s); training needs at least 2")
    inputs = torch.from_numpy(features_of(table, feature_names(table.column_names, features, label)))
    targets, classes = labels_of(table, label)
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(len(inputs) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return (TensorDataset(inputs[train], targets[train]), TensorDataset(inputs[val], targets[val]),
            len(classes) if classes is not None else 1)
