"""Horovod's Gloo variables from an srun step's SLURM_* (cluster/slurm_gloo_env.py): pure functions, no Slurm.
The real srun run is tests/cluster/test_slurm_hosts.py."""
from __future__ import annotations

import pytest

from hvdtrain.cluster.slurm_gloo_env import applies, gloo_env, rendezvous_port, slots
from hvdtrain.errors import HostsError

# Task 3 of `srun -N2 -n5` (block): node n1 runs ranks 0-2, node n2 ranks 3-4.
STEP = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "5", "SLURM_PROCID": "3",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "3,2", "SLURMD_NODENAME": "n2"}


def test_a_task_of_a_two_node_step_gets_what_horovodrun_gloo_would_give_it():
    found, everyone = gloo_env(STEP)
    assert found == {
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "5", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_HOSTNAME": "n2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "n1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(20000 + 1234 * 16 % 30000),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in everyone] == [
        ("n1", 0, 0, 3, 0, 2), ("n1", 1, 1, 3, 0, 2), ("n1", 2, 2, 3, 0, 1), ("n2", 3, 0, 2, 1, 2),
        ("n2", 4, 1, 2, 1, 2)]
    # The slot rank 3 reads from the server's plan is the one its own variables describe.
    mine = everyone[3]
    assert (str(mine.local_rank), str(mine.cross_rank), str(mine.cross_size)) == (
        found["HOROVOD_LOCAL_RANK"], found["HOROVOD_CROSS_RANK"], found["HOROVOD_CROSS_SIZE"])


def test_the_third_local_rank_has_no_peer_on_the_smaller_node():
    found, _ = gloo_env({**STEP, "SLURM_PROCID": "2", "SLURM_LOCALID": "2", "SLURM_NODEID": "0",
                         "SLURMD_NODENAME": "n1"})
    assert (found["HOROVOD_CROSS_RANK"], found["HOROVOD_CROSS_SIZE"], found["HOROVOD_LOCAL_SIZE"]) == ("0", "1", "3")


def test_interface_and_port_from_the_user():
    found, _ = gloo_env({**STEP, "HVDTRAIN_IFACE": "ib0", "HVDTRAIN_GLOO_PORT": "29400"})
    assert found["HOROVOD_GLOO_IFACE"] == found["NCCL_SOCKET_IFNAME"] == "ib0"
    assert found["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "29400"


def test_every_task_of_a_step_agrees_on_the_port_and_a_requeue_keeps_it():
    ports = {rendezvous_port({**STEP, "SLURM_PROCID": str(rank)}) for rank in range(5)}
    assert len(ports) == 1 and 20000 <= ports.pop() < 50000
    assert rendezvous_port({**STEP, "SLURM_STEP_ID": "1"}) != rendezvous_port(STEP)


@pytest.mark.parametrize("change", [
    {"PMIX_RANK": "3"},                  # srun --mpi=pmix: MPI takes the world from PMIx
    {"PMI_RANK": "3"},                   # srun --mpi=pmi2
    {"OMPI_COMM_WORLD_RANK": "3"},       # mpirun (horovodrun --mpi) inside the allocation
    {"HOROVOD_RANK": "3"},               # horovodrun --gloo
    {"SLURM_STEP_NUM_TASKS": "1"},       # one task: nothing to join
    {"SLURM_STEP_ID": str(0xFFFFFFFB)},  # the batch script itself, not an srun step
    {"HVDTRAIN_SLURM_GLOO": "0"},        # turned off
])
def test_nothing_where_someone_else_set_the_world_up_or_no_srun_step(change):
    env = {**STEP, **change}
    assert not applies(env) and gloo_env(env) == ({}, [])


def test_no_slurm_no_change():
    assert gloo_env({}) == ({}, [])


@pytest.mark.parametrize("change, named", [
    ({"SLURM_STEP_TASKS_PER_NODE": "3"}, "disagree"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3,x"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_PROCID": "7"}, "task rank 7"),
    ({"SLURM_NODEID": ""}, "SLURM_NODEID=''"),
    ({"HVDTRAIN_GLOO_PORT": "70000"}, "HVDTRAIN_GLOO_PORT=70000"),
])
def test_a_bad_value_is_one_error_naming_it(change, named):
    with pytest.raises(HostsError, match=named.replace("(", r"\(")):
        gloo_env({**STEP, **change})


def test_slots_count_mismatch_names_both_lists():
    with pytest.raises(HostsError, match="2 node"):
        slots(["a", "b"], [1])
