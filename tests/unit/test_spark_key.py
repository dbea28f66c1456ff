"""The Spark store key: what the data is and every choice that shapes it, so a stale store is never reused."""
from __future__ import annotations

import os

from hvdtrain.spark.store import data_key


class FakeFrame:
    """What data_key reads of a DataFrame: a folder scan's plan names the folder, not its files."""

    def __init__(self, files):
        self.files = files
        self.schema = type("Schema", (), {"json": lambda self: '{"fields": []}'})()

    def semanticHash(self):  # noqa: N802 - Spark's name
        return 1234

    def inputFiles(self):  # noqa: N802 - Spark's name
        return [f"file:{f}" for f in self.files]


def test_files_added_or_rewritten_in_the_source_folder_give_a_new_key(tmp_path):
    first = tmp_path / "part-0.parquet"
    first.write_bytes(b"rows")
    key = data_key(FakeFrame([first]), ["x"], ["y"], 0.2, 42, None)
    assert data_key(FakeFrame([first]), ["x"], ["y"], 0.2, 42, None) == key
    added = tmp_path / "part-1.parquet"
    added.write_bytes(b"more rows")
    assert data_key(FakeFrame([first, added]), ["x"], ["y"], 0.2, 42, None) != key
    first.write_bytes(b"other rows")
    os.utime(first, ns=(1, 1))
    assert data_key(FakeFrame([first]), ["x"], ["y"], 0.2, 42, None) != key


def test_a_run_id_names_the_key_but_the_columns_and_validation_still_change_it(tmp_path):
    frame = FakeFrame([])
    key = data_key(frame, ["x"], ["y"], 0.2, 42, "digits-v1")
    assert key.startswith("digits-v1-")
    assert data_key(frame, ["x", "z"], ["y"], 0.2, 42, "digits-v1") != key
    assert data_key(frame, ["x"], ["y"], 0.3, 42, "digits-v1") != key
    assert data_key(frame, ["x"], ["y"], "held_out", 42, "digits-v1") != key
