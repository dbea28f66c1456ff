"""Run folders and files that two runs could share: whole files, and one run per folder."""
from __future__ import annotations

import fcntl
import logging
import os
import socket

import pytest

from hvdtrain.errors import UserError
from hvdtrain.output import claim
from hvdtrain.output.files import atomic_write


def test_atomic_write_removes_its_temp_file_whatever_the_writer_raises(tmp_path):
    def broken(handle):
        handle.write(b"half")
        raise ValueError("not an OSError")

    with pytest.raises(ValueError):
        atomic_write(tmp_path / "summary.json", broken)
    assert list(tmp_path.iterdir()) == []


def hold_like_another_run(folder, owner=b"pid 4242 on elsewhere"):
    """A second open file description: flock treats it as another process's lock."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / claim.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, owner, 0)
    return fd


def test_a_folder_another_run_holds_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    run = tmp_path / "same-name"
    fd = hold_like_another_run(run)
    try:
        for fresh in (True, False):  # a new run and a resume alike
            with pytest.raises(UserError, match=r"^run directory .*same-name is in use by another run "
                                                r"\(pid 4242 on elsewhere\); pass a new --name") as err:
                claim.claim(run, fresh=fresh)
            assert "\n" not in str(err.value)
        assert sorted(p.name for p in run.iterdir()) == [claim.LOCK]
        assert (run / claim.LOCK).read_bytes() == b"pid 4242 on elsewhere"
    finally:
        os.close(fd)


def test_a_new_run_is_refused_a_folder_that_holds_a_run_and_adds_nothing_to_it(tmp_path):
    run = tmp_path / "done"
    run.mkdir()
    (run / "config.yaml").write_text("epochs: 1\n")
    with pytest.raises(UserError, match="already holds a run; pass a new --name, or --resume auto"):
        claim.claim(run, fresh=True)
    assert [p.name for p in run.iterdir()] == ["config.yaml"]
    claim.claim(run, fresh=False).release()  # its own resume is welcome
    assert [p.name for p in run.iterdir()] == ["config.yaml"]


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(tmp_path, caplog):
    run = tmp_path / "killed"
    os.close(hold_like_another_run(run, b"pid 999999 on this-host"))  # closing drops the flock, as death does
    (run / "config.yaml").write_text("epochs: 1\n")
    with caplog.at_level(logging.INFO, logger="hvdtrain"):
        held = claim.claim(run, fresh=False)
    assert "was locked by a run that is gone (pid 999999 on this-host); taking it over" in caplog.text
    assert (run / claim.LOCK).read_text() == f"pid {os.getpid()} on {socket.gethostname()}"
    held.release()
    assert [p.name for p in run.iterdir()] == ["config.yaml"]


def test_release_leaves_no_trace_of_a_run_that_wrote_nothing_and_only_its_own_claim(tmp_path):
    first = claim.claim_new(tmp_path, "mlp-digits-20250101-000000")
    second = claim.claim_new(tmp_path, "mlp-digits-20250101-000000")  # the same second
    assert (first.path.name, second.path.name) == ("mlp-digits-20250101-000000", "mlp-digits-20250101-000000-2")
    first.release()
    assert not first.path.exists()  # made by the claim and never written: gone
    first.release()                 # twice: harmless
    with pytest.raises(UserError, match=r"in use by another run \(pid \d+ .*\); close\(\) the earlier Trainer"):
        claim.claim(second.path, fresh=True)   # this process's own unclosed run: told how to end it
    second.release()
    assert not second.path.exists()
    again = claim.claim(second.path, fresh=True)
    assert (second.path / claim.LOCK).exists()
    again.release()
    assert not second.path.exists()
