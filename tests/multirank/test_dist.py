"""Tier 3: real Horovod across two processes, Gloo and MPI."""
from conftest import BACKENDS, horovodrun, show
from worker_fns import _wait_cpu

import hvdtrain


@BACKENDS
def test_allreduce_and_broadcast_on_two_ranks(backend):
    proc = horovodrun(2, ["tests/ranks/smoke.py"], backend)
    assert proc.returncode == 0, show(proc)
    assert "SMOKE-OK rank=0 size=2" in proc.stdout, show(proc)
    assert "SMOKE-OK rank=1 size=2" in proc.stdout, show(proc)


def test_a_rank_waiting_for_a_late_peer_sleeps_instead_of_spinning():
    """Horovod's synchronize() spins while it waits (a full core, on the core its background threads
    need); hvdtrain's waits poll and sleep. Rank 1 comes 1.5 s late to each of two allreduces."""
    late_s = 1.5
    results = hvdtrain.launch(_wait_cpu, late_s, np=2, all_ranks=True)
    rank, verdicts, cpu = results[0]
    assert rank == 0 and verdicts == [True, True]
    assert cpu["sleep"] < 0.2 * late_s, cpu
    assert cpu["spin"] > 0.5 * late_s, cpu     # what it avoids: Horovod's own wait burns the core
