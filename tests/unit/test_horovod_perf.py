"""hvdtrain's Horovod patch for idle cycles (scripts/horovod_perf.py) and the setting that turns it on."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import install_horovod as ih
import pytest

from hvdtrain.distributed import settings


@pytest.fixture(scope="module")
def horovod_source(tmp_path_factory):
    """The real horovod 0.28.1 sdist, downloaded with pip and unpacked (a copy of its own: it gets patched)."""
    dest = tmp_path_factory.mktemp("sdist")
    src = ih.download_sdist(sys.executable, dest, dest / "download.log")
    return Path(shutil.copytree(src, dest / "patched", symlinks=True))


def test_idle_patch_applies_exactly_once_to_the_real_sources(horovod_source):
    files = [horovod_source / rel for rel in ih.PERF_PATCHES]
    originals = [f.read_text() for f in files]
    assert ih.apply_perf(horovod_source) is True
    patched = [f.read_text() for f in files]
    assert ih.apply_perf(horovod_source) is False
    assert [f.read_text() for f in files] == patched
    for path, before, after in zip(files, originals, patched, strict=True):
        assert ih.PERF_MARKER in after and after != before, path
    queue = (horovod_source / "horovod/common/tensor_queue.cc").read_text()
    assert queue.count("enqueued_.notify_one();") == 2   # both ways in: one tensor, a grouped list
    operations = (horovod_source / "horovod/common/operations.cc").read_text()
    assert '"HOROVOD_IDLE_CYCLE_TIME"' in operations and "WaitWhileIdle(" in operations


def test_the_idle_wait_is_asked_for_gloo_ops_only_and_never_over_the_users_value():
    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}
    assert settings.idle_defaults(gloo) == {"HOROVOD_IDLE_CYCLE_TIME": settings.IDLE_CYCLE_TIME_MS}
    assert settings.idle_defaults({"HOROVOD_CONTROLLER": "gloo"}) == {"HOROVOD_IDLE_CYCLE_TIME": "50"}
    assert settings.idle_defaults({**gloo, "HOROVOD_IDLE_CYCLE_TIME": "0"}) == {}   # the user's, 0 = off
    assert settings.idle_defaults({"OMPI_COMM_WORLD_SIZE": "2"}) == {}               # MPI ops: a peer would poll
    assert settings.idle_defaults({}) == {}
