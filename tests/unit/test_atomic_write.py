"""atomic_write's temp file is always a new file of its own: a leftover is replaced, a symlink planted at its
predictable name is never followed. (Issue 51, item 8.)"""
from __future__ import annotations

import os

import pytest

from hvdtrain.errors import UserError
from hvdtrain.output import files
from hvdtrain.output.files import atomic_write, write_text


def test_a_symlink_at_the_temp_name_is_removed_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    (tmp_path / ".summary.json.tmp").symlink_to(victim)
    write_text(tmp_path / "summary.json", "{}")
    assert victim.read_text() == "someone else's file"
    assert (tmp_path / "summary.json").read_text() == "{}" and not (tmp_path / "summary.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "victim.txt"]


def test_a_dangling_symlink_at_the_temp_name_creates_nothing_at_its_target(tmp_path):
    target = tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()
    (tmp_path / ".model.pt.tmp").symlink_to(target)
    atomic_write(tmp_path / "model.pt", lambda f: f.write(b"weights"))
    assert not target.exists()
    assert (tmp_path / "model.pt").read_bytes() == b"weights"


def test_a_leftover_temp_file_is_replaced_by_a_new_one(tmp_path):
    leftover = tmp_path / ".report.json.tmp"
    leftover.write_text("half of a crashed write, and more")
    atomic_write(tmp_path / "report.json", lambda f: f.write(b"{}"))
    assert (tmp_path / "report.json").read_text() == "{}"   # not "{}lf of a crashed write...": a new file
    assert not leftover.exists()


def _planting(monkeypatch, tmp, victim, times):
    """os.open as an attacker racing us sees it: a symlink appears at `tmp` just before the first `times` opens."""
    real_open, planted = os.open, []

    def racing_open(path, flags, mode=0o777):
        if os.fspath(path) == os.fspath(tmp) and len(planted) < times:
            os.symlink(victim, tmp)
            planted.append(path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(files.os, "open", racing_open)
    return planted


def test_a_symlink_planted_between_the_unlink_and_the_open_is_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    tmp = tmp_path / ".summary.json.tmp"
    planted = _planting(monkeypatch, tmp, victim, times=1)
    write_text(tmp_path / "summary.json", "{}")
    assert planted and victim.read_text() == "keep"
    assert (tmp_path / "summary.json").read_text() == "{}" and not tmp.is_symlink()


def test_a_link_planted_at_every_try_fails_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    tmp = tmp_path / ".summary.json.tmp"
    _planting(monkeypatch, tmp, victim, times=99)
    with pytest.raises(UserError, match=r"cannot write .*summary\.json: File exists"):
        write_text(tmp_path / "summary.json", "{}")
    assert victim.read_text() == "keep"
    assert not (tmp_path / "summary.json").exists() and not tmp.is_symlink()
