"""Tier 3: real Horovod across two processes, Gloo and MPI."""
from conftest import BACKENDS, horovodrun, show


@BACKENDS
def test_allreduce_and_broadcast_on_two_ranks(backend):
    proc = horovodrun(2, ["tests/ranks/smoke.py"], backend)
    assert proc.returncode == 0, show(proc)
    assert "SMOKE-OK rank=0 size=2" in proc.stdout, show(proc)
    assert "SMOKE-OK rank=1 size=2" in proc.stdout, show(proc)
