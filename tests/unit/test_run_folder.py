"""Run folders and files that two runs could share: whole files, and one run per folder."""
from __future__ import annotations

import pytest

from hvdtrain.output.files import atomic_write


def test_atomic_write_removes_its_temp_file_whatever_the_writer_raises(tmp_path):
    def broken(handle):
        handle.write(b"half")
        raise ValueError("not an OSError")

    with pytest.raises(ValueError):
        atomic_write(tmp_path / "summary.json", broken)
    assert list(tmp_path.iterdir()) == []
