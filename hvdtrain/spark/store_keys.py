"""A store key's attempts and marker: each write goes into a new attempt folder and is trusted only once the
marker, written last in one put, names it (object stores cannot rename a folder). See spark/store.py.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from hvdtrain.errors import UserError
from hvdtrain.spark.layout import FOLDER, MARKER, VAL_FLAG


def ensure_key(fs: Any, root: str, key: str, write: Callable[[str], None], feature_cols: list[str],
               label_cols: list[str], validation: Any, *, min_rows: int = 1) -> tuple[dict[str, Any], bool]:
    """KEY's marker: the complete attempt already there, or one new attempt written and marked complete.

    The filesystem side of `materialize`, on any pyarrow filesystem; it never renames a folder.

    Args:
        write: writes the rows under the folder it is given, as `VAL_FLAG=false|true/*.parquet`; called
            only when KEY has no complete attempt.
    Returns:
        (the marker's contents, True when they were found rather than written by this call).
    Example:
        meta, reused = ensure_key(fs, "/store", "df-1234", writer, ["x"], ["y"], 0.2)
    """
    final = f"{root}/{FOLDER}/{key}"
    found = read_key(fs, final)
    if found is not None:
        _remove_stale(fs, final, found)
        return found, True
    attempt = f"attempt-{uuid.uuid4().hex[:12]}"
    folder = f"{final}/{attempt}"
    created_root = not _exists(fs, root)
    try:
        write(folder)
        _reached("data")
        train_files = _parquet_files(fs, f"{folder}/{VAL_FLAG}=false")
        val_files = _parquet_files(fs, f"{folder}/{VAL_FLAG}=true")
        train_rows, val_rows = _rows(fs, train_files), _rows(fs, val_files)
        if train_rows < max(min_rows, 1):
            raise UserError(f"the DataFrame has {train_rows} training row(s) for {min_rows} worker(s) "
                            f"({val_rows} held out); every worker needs at least one row" if train_rows else
                            f"the DataFrame has no training rows ({val_rows} held out); check its filter/source")
        if validation and not val_rows:
            raise UserError(f"validation {validation!r} held out no rows of {train_rows}; use a larger fraction, "
                            "mark some rows in the column, or validation=None")
        meta: dict[str, Any] = {"attempt": attempt, "train_files": train_files, "val_files": val_files,
                                "feature_cols": feature_cols, "label_cols": label_cols,
                                "classes": _classes(fs, train_files, label_cols),
                                "train_rows": train_rows, "val_rows": val_rows}
        _reached("marker")
        other = read_key(fs, final)   # a concurrent fit of the same data finished first: use its attempt
        if other is not None:
            _remove(fs, folder)
            return other, True
        _write_marker(fs, final, meta)
    except BaseException:
        _remove(fs, folder)
        _remove_empty(fs, final)
        _remove_empty(fs, f"{root}/{FOLDER}")
        if created_root:
            _remove_empty(fs, root)
        raise
    _reached("cleanup")
    _remove_stale(fs, final, meta)
    return meta, False


def read_key(fs: Any, final: str) -> dict[str, Any] | None:
    """The marker of KEY's folder `final`, if it names an attempt whose files are all there; else None.

    A missing, unreadable or half-written marker, or one naming files that are gone, means "not
    written yet": the caller writes a fresh attempt. Markers from before attempts (no "attempt";
    files directly under KEY) are read as they were.
    """
    import pyarrow.fs as pafs

    try:
        with fs.open_input_stream(f"{final}/{MARKER}") as stream:
            meta = json.loads(stream.read())
    except (OSError, ValueError):  # not there, or cut short by a crash while it was put
        return None
    wanted = ("train_files", "val_files", "feature_cols", "label_cols", "classes", "train_rows", "val_rows")
    if not isinstance(meta, dict) or any(k not in meta for k in wanted) or "store" in meta or "key" in meta:
        return None  # not a marker this layout wrote (a newer layout writes "store"/"key")
    base = f"{final}/{meta['attempt']}" if meta.get("attempt") else final
    try:
        present = {i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True)) if i.is_file}
    except OSError:
        return None
    if not set(meta["train_files"]) | set(meta["val_files"]) <= present:
        return None
    return meta


def fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The marker's entries that Materialized holds (the attempt's name is the store's own business)."""
    return {k: v for k, v in meta.items() if k != "attempt"}


def _reached(step: str) -> None:
    """Each step of write_key ("data", "marker", "cleanup") passes here; the crash tests stop the process at one."""


def _classes(fs: Any, files: list[str], label_cols: list[str]) -> list[Any] | None:
    """Sorted class values of one integer/string/boolean label; None for float labels (regression).
    Reads the label column alone (small next to the features)."""
    import pyarrow.dataset as ds
    import pyarrow.types as pat

    data = ds.dataset(files, format="parquet", filesystem=fs)
    kind = data.schema.field(label_cols[0]).type
    if len(label_cols) > 1 or pat.is_floating(kind):
        return None
    return sorted(set(data.to_table(columns=[label_cols[0]]).column(0).to_pylist()))


def _parquet_files(fs: Any, folder: str) -> list[str]:
    import pyarrow.fs as pafs

    if fs.get_file_info(folder).type == pafs.FileType.NotFound:
        return []
    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True))
    return sorted(i.path for i in infos if i.is_file and i.path.endswith(".parquet"))


def _rows(fs: Any, files: list[str]) -> int:
    from hvdtrain.data.streaming import open_parquet

    return sum(open_parquet(f, fs).metadata.num_rows for f in files)


def _write_marker(fs: Any, final: str, meta: dict[str, Any]) -> None:
    # One put: on an object store the marker appears whole or not at all (no rename there, and none
    # needed); on a local disk a crash mid-write leaves a marker read_key refuses, so a fresh attempt.
    with fs.open_output_stream(f"{final}/{MARKER}") as stream:
        stream.write(json.dumps(meta, indent=1).encode())


def _remove_stale(fs: Any, final: str, meta: dict[str, Any]) -> None:
    """Best effort: remove what the marker does not name under KEY (crashed or superseded attempts).
    Markers from before attempts name files directly under KEY: nothing there is stale."""
    import pyarrow.fs as pafs

    if not meta.get("attempt"):
        return
    keep = {f"{final}/{meta['attempt']}", f"{final}/{MARKER}"}
    try:
        entries = fs.get_file_info(pafs.FileSelector(final, recursive=False))
    except OSError:
        return
    for entry in entries:
        if entry.path.rstrip("/") not in keep:
            try:
                _remove(fs, entry.path)
            except OSError:
                pass  # another process removed it, or no permission: left for the next fit


def _exists(fs: Any, path: str) -> bool:
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _remove(fs: Any, path: str) -> None:
    import pyarrow.fs as pafs

    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def _remove_empty(fs: Any, path: str) -> None:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.Directory and not fs.get_file_info(
            pafs.FileSelector(path, recursive=False)):
        fs.delete_dir(path)

