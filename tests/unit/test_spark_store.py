"""The Spark store on pyarrow filesystems, without Spark: attempts marked complete last, never a folder rename.

Every test runs on `NoRename`, a real pyarrow filesystem (a PyFileSystem over the local disk) whose
`move` raises as S3 and GCS do for folders: a store that renamed anything would fail here. The crash
tests kill a writer process (SIGKILL) at each step and check that the next fit of the same key
succeeds and reads exactly the complete rows. One test runs the store on a real S3 server on loopback (moto's
standalone server from its own virtualenv, support.s3_server) through pyarrow's S3FileSystem, as fit opens it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from support.s3_server import running_s3_server

from hvdtrain.errors import UserError
from hvdtrain.spark import store
from hvdtrain.spark.store import FOLDER, MARKER, VAL_FLAG, ensure_key, read_key

KEY = "df-0123456789abcdef"
IDS = list(range(30))           # ids % 5 == 0 are held out
TRAIN = [i for i in IDS if i % 5]
VAL = [i for i in IDS if not i % 5]


class NoRename(pafs.FileSystemHandler):
    """The local disk, less rename: pyarrow's S3 and GCS filesystems cannot move a folder."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()

    def move(self, src, dest):
        raise OSError(f"rename of {src} refused: object stores have no folder rename")

    def get_type_name(self):
        return "norename"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not in a test")

    def delete_file(self, path):
        self.local.delete_file(path)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path, metadata=metadata)


def no_rename_fs() -> pafs.FileSystem:
    return pafs.PyFileSystem(NoRename())


def write_rows(fs: pafs.FileSystem, folder: str, *, die_after_files: int | None = None) -> None:
    """What Spark's partitioned write leaves: 3 training files and 1 held-out file of (x, y, id)."""
    chunks = [(False, TRAIN[:8]), (False, TRAIN[8:16]), (False, TRAIN[16:]), (True, VAL)]
    for n, (held_out, ids) in enumerate(chunks):
        if die_after_files is not None and n == die_after_files:
            os.kill(os.getpid(), signal.SIGKILL)
        part = f"{folder}/{VAL_FLAG}={str(held_out).lower()}"
        fs.create_dir(part)
        table = pa.table({"x": [float(i) for i in ids], "y": [i % 3 for i in ids], "id": ids})
        pq.write_table(table, f"{part}/part-{n:05d}.parquet", filesystem=fs)


def write_all(folder: str, fs: pafs.FileSystem | None = None) -> None:
    write_rows(fs or no_rename_fs(), folder)


def ids_of(fs: pafs.FileSystem, files: list[str]) -> list[int]:
    return sorted(i for f in files for i in pq.read_table(f, filesystem=fs, columns=["id"]).column(0).to_pylist())


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / FOLDER / KEY).iterdir())


CHILD = """
import os, signal, sys
sys.path[:0] = [{tests!r}, {support!r}]      # the test module, and the support package it imports
import test_spark_store as t
from hvdtrain.spark import store, store_keys

root, step = sys.argv[1], sys.argv[2]
if step != "partial":
    store_keys._reached = lambda at: os.kill(os.getpid(), signal.SIGKILL) if at == step else None
fs = t.no_rename_fs()
die_after = 2 if step == "partial" else None
store.ensure_key(fs, root, t.KEY, lambda folder: t.write_rows(fs, folder, die_after_files=die_after), ["x"], ["y"], 0.2)
"""


def crash_at(root: Path, step: str) -> None:
    here = Path(__file__).parent
    child = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(here), support=str(here.parent)), str(root),
                            step], capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, (step, child.returncode, child.stderr[-2000:])


@pytest.mark.parametrize("step", ["partial", "data", "marker", "cleanup"])
def test_a_writer_killed_at_any_step_leaves_a_key_the_next_fit_reads_whole(tmp_path, step):
    root = tmp_path / "store"
    crash_at(root, step)
    fs = no_rename_fs()
    crashed = entries(root)
    assert any(name.startswith("attempt-") for name in crashed), crashed
    assert (MARKER in crashed) == (step == "cleanup"), crashed     # the marker is the last thing written
    if step != "cleanup":
        assert read_key(fs, f"{root}/{FOLDER}/{KEY}") is None     # a crashed attempt is never trusted

    meta, reused = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)
    assert reused == (step == "cleanup")
    assert ids_of(fs, meta["train_files"]) == TRAIN and ids_of(fs, meta["val_files"]) == VAL
    assert (meta["train_rows"], meta["val_rows"], meta["classes"]) == (len(TRAIN), len(VAL), [0, 1, 2])
    assert entries(root) == sorted([meta["attempt"], MARKER])      # crashed attempts removed
    again, reused = ensure_key(fs, str(root), KEY, pytest.fail, ["x"], ["y"], 0.2)
    assert reused and again == meta


def test_the_wrapper_refuses_a_folder_rename_as_s3_does(tmp_path):
    fs = no_rename_fs()
    fs.create_dir(str(tmp_path / "a"))
    with pytest.raises(OSError, match="no folder rename"):
        fs.move(str(tmp_path / "a"), str(tmp_path / "b"))


def test_a_key_left_by_the_old_rename_layout_without_a_marker_is_written_beside_not_directory_not_empty(tmp_path):
    """The crash the old layout wedged on: rows moved to KEY, no _meta.json written."""
    fs, root = no_rename_fs(), tmp_path / "store"
    write_rows(fs, str(root / FOLDER / KEY))
    meta, reused = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)
    assert not reused and ids_of(fs, meta["train_files"]) == TRAIN
    assert entries(root) == sorted([meta["attempt"], MARKER])


def test_a_marker_from_the_old_layout_is_still_read(tmp_path):
    fs, root = no_rename_fs(), tmp_path / "store"
    final = root / FOLDER / KEY
    write_rows(fs, str(final))
    train = sorted(str(p) for p in (final / f"{VAL_FLAG}=false").iterdir())
    val = sorted(str(p) for p in (final / f"{VAL_FLAG}=true").iterdir())
    (final / MARKER).write_text(json.dumps({"train_files": train, "val_files": val, "feature_cols": ["x"],
                                            "label_cols": ["y"], "classes": [0, 1, 2], "train_rows": len(TRAIN),
                                            "val_rows": len(VAL)}))
    meta, reused = ensure_key(fs, str(root), KEY, pytest.fail, ["x"], ["y"], 0.2)
    assert reused and meta["train_files"] == train and len(entries(root)) == 3     # nothing removed


@pytest.mark.parametrize("marker", ['{"attempt": "attempt-1", "train_fi', "not json", "[]"])
def test_a_marker_cut_short_is_no_marker(tmp_path, marker):
    fs, root = no_rename_fs(), tmp_path / "store"
    (root / FOLDER / KEY).mkdir(parents=True)
    (root / FOLDER / KEY / MARKER).write_text(marker)
    meta, reused = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)
    assert not reused and ids_of(fs, meta["train_files"]) == TRAIN
    assert read_key(fs, str(root / FOLDER / KEY)) == meta


def test_a_marker_naming_files_that_are_gone_is_rewritten(tmp_path):
    fs, root = no_rename_fs(), tmp_path / "store"
    first, _ = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)
    os.remove(first["train_files"][1])
    second, reused = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)
    assert not reused and second["attempt"] != first["attempt"] and ids_of(fs, second["train_files"]) == TRAIN
    assert entries(root) == sorted([second["attempt"], MARKER])


def test_a_concurrent_fit_that_marked_the_key_first_is_used_and_ours_discarded(tmp_path):
    fs, root = no_rename_fs(), tmp_path / "store"
    theirs = {}

    def slow_writer(folder):
        theirs["meta"], _ = ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2)   # finishes first
        write_all(folder)

    meta, reused = ensure_key(fs, str(root), KEY, slow_writer, ["x"], ["y"], 0.2)
    assert reused and meta == theirs["meta"]
    assert entries(root) == sorted([meta["attempt"], MARKER])


def test_an_error_removes_the_attempt_and_the_folders_it_made(tmp_path):
    fs, root = no_rename_fs(), tmp_path / "store"
    with pytest.raises(UserError, match="training row"):
        ensure_key(fs, str(root), KEY, write_all, ["x"], ["y"], 0.2, min_rows=100)
    assert not root.exists()


def test_the_marker_is_written_in_one_put(tmp_path, monkeypatch):
    """Object stores make one put atomic; a temporary name moved into place is a rename they do not have."""
    fs, root = no_rename_fs(), tmp_path / "store"
    puts = []
    opened = NoRename.open_output_stream

    def counting(self, path, metadata):
        puts.append(path)
        return opened(self, path, metadata)

    monkeypatch.setattr(NoRename, "open_output_stream", counting)
    ensure_key(fs, str(root), KEY, lambda folder: write_rows(pafs.LocalFileSystem(), folder), ["x"], ["y"], 0.2)
    assert puts == [f"{root}/{FOLDER}/{KEY}/{MARKER}"]


@pytest.fixture
def s3_endpoint(tmp_path):
    """moto's S3 server on 127.0.0.1 (support.s3_server: its own virtualenv, made by make setup), for this test."""
    with running_s3_server(tmp_path / "moto_server.log") as endpoint:
        yield endpoint


def test_on_an_s3_server_through_the_store_url(s3_endpoint):
    """moto's S3 server and pyarrow's own S3FileSystem, opened from the store URL as fit does."""
    url = f"s3://key:secret@bucket/store?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1"
    fs, root = store.filesystem_of(url)
    assert fs.type_name == "s3"
    pafs.S3FileSystem(access_key="key", secret_key="secret", endpoint_override=s3_endpoint, scheme="http",
                      region="us-east-1", allow_bucket_creation=True).create_dir("bucket")
    fs.create_dir(f"{root}/{FOLDER}/{KEY}/attempt-crashed/{VAL_FLAG}=false")   # a crashed attempt's leftovers
    with fs.open_output_stream(f"{root}/{FOLDER}/{KEY}/attempt-crashed/{VAL_FLAG}=false/part.parquet") as out:
        out.write(b"half a file")
    meta, reused = ensure_key(fs, root, KEY, lambda folder: write_rows(fs, folder), ["x"], ["y"], 0.2)
    assert not reused and ids_of(fs, meta["train_files"]) == TRAIN and ids_of(fs, meta["val_files"]) == VAL
    listing = fs.get_file_info(pafs.FileSelector(f"{root}/{FOLDER}/{KEY}"))
    assert sorted(i.base_name for i in listing) == sorted([meta["attempt"], MARKER])
    again, reused = ensure_key(fs, root, KEY, pytest.fail, ["x"], ["y"], 0.2)
    assert reused and again == meta
    with pytest.raises(OSError):       # and S3 has no folder rename, as NoRename stands in for everywhere else
        fs.move(f"{root}/{FOLDER}/{KEY}/{meta['attempt']}", f"{root}/{FOLDER}/{KEY}/renamed")
