"""The setting that turns hvdtrain's idle-cycle patch on (scripts/horovod/patches/0008-...; the patch itself applying to
the real sources is in test_horovod_patches.py, with the rest of the series)."""
from __future__ import annotations

from hvdtrain.distributed import horovod_settings as settings


def test_the_idle_wait_is_asked_for_gloo_ops_only_and_never_over_the_users_value():
    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}
    assert settings.idle_defaults(gloo) == {"HOROVOD_IDLE_CYCLE_TIME": settings.IDLE_CYCLE_TIME_MS}
    assert settings.idle_defaults({"HOROVOD_CONTROLLER": "gloo"}) == {"HOROVOD_IDLE_CYCLE_TIME": "50"}
    assert settings.idle_defaults({**gloo, "HOROVOD_IDLE_CYCLE_TIME": "0"}) == {}   # the user's, 0 = off
    assert settings.idle_defaults({"OMPI_COMM_WORLD_SIZE": "2"}) == {}               # MPI ops: a peer would poll
    assert settings.idle_defaults({}) == {}
